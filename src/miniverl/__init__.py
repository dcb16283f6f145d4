"""miniverl: on-policy distillation of tool-using language-model agents, on a CPU or one GPU.

Importing the package imports nothing heavy: torch is loaded lazily by the layers that
need it, so ``miniverl doctor|validate|inspect|report|cache`` work without torch.
"""

__version__ = "0.3.0"

__all__ = ["__version__"]
