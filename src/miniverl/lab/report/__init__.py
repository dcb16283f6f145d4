"""``miniverl report``: report.html and summary.md for a run or benchmark directory.

The lab's view of a run: learning curves, token views of the teacher's targets, resources,
and a benchmark's arms and contrasts. It reads the run directory through the core's one
reader (:mod:`miniverl.inspection.run_dir`) and imports no torch.
"""
