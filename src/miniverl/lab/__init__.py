"""The lab: the studies of the algorithm, one layer above it.

The benchmark harness (``benchmark/``: cells, arms, budgets and compute matching, protocol,
statistics, contrasts, the learning-rate grid, the warm-up criterion, cold-start export),
the teachers a study distils from (``teachers/``: the toy teacher and HF adapter fits, DAgger
labelling, the oracle teacher, the teacher gate and audit), the report (``report/``), the
translation of a recipe to verl (``verl/``), the recipe's ``lab:`` section (``config.py``),
and how a run is started with them (``run.py``, ``cycles.py``). It imports the core
(``miniverl.*``); the core never imports it (``tests/unit/test_layering.py``).
"""
