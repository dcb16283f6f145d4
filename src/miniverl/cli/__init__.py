"""The ``miniverl`` command line (``miniverl.cli.main:app``)."""
