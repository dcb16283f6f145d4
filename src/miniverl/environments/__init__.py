"""Tool environments (no torch): the contract, the registry and ``calculator``."""
