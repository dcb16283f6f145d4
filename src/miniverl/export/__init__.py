"""Taking results out of miniverl: the trained student (``model``), a shareable
``result.json`` (``result``) and the verl tool an exported verl experiment runs
(``verl_tool``; the recipe translation itself is the lab's ``miniverl.lab.verl``).

Nothing is imported here, so ``miniverl export`` and ``export-verl`` load only their own
torch-free module and never the model exporter, which needs torch.
"""
