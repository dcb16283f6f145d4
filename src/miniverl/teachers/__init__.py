"""Teacher scoring: the supervision side of the supervision seam (docs/design.md §2.1, §3.5).

Imports torch (it scores with a live model); the torch-free surfaces import
:mod:`miniverl.cache` only.
"""

from miniverl.teachers.local import LocalTeacherScorer, LossMode, ScoreShape, TeacherScoreResult

__all__ = ["LocalTeacherScorer", "LossMode", "ScoreShape", "TeacherScoreResult"]
