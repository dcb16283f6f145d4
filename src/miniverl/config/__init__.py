"""Validated configuration (``RunConfig``)."""
