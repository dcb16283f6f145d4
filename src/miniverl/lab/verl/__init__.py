"""Carrying a recipe over to verl: the translation (``export.py``) and its per-key ledger
(``ledger.py``). The verl tool the exported experiment runs is the core's
``miniverl.export.verl_tool``, because it executes inside verl's own environment.
"""
