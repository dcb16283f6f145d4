"""Taking results out of miniverl: a recipe to verl (``verl``), the trained student (``model``),
a shareable ``result.json`` (``result``).

Nothing is imported here, so ``miniverl export`` and ``export-verl`` load only their own
torch-free module and never the model exporter, which needs torch.
"""
