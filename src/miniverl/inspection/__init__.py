"""Torch-free summaries of trajectory files for ``miniverl inspect``."""
