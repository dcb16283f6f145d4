"""Foundation utilities (no torch at import time): paths, seeds, atomic I/O, logging."""
