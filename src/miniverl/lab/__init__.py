"""The lab: the studies of the algorithm, one layer above it.

The benchmark harness (cells, arms, budgets and compute matching, protocol, statistics,
contrasts, the learning-rate grid, cold-start export), teacher fitting (the toy teacher, the
HF adapter, DAgger labelling), the oracle teacher, the teacher gate and audit, and the lab's
section of a recipe (``lab/config.py``). It imports the core (``miniverl.*``); the core never
imports it (``tests/unit/test_layering.py``).
"""
