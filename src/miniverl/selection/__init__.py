"""Which model-generated positions enter the loss (no torch)."""
