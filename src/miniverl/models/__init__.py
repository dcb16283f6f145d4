"""Model backends behind one narrow contract (``models.base.CausalLMBackend``)."""
