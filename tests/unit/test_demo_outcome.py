"""The demo's outcome lines: the teacher's held-out success is read from the run's own
teacher event, and the sentence states only what the counts say."""

from __future__ import annotations

import json
from pathlib import Path

from miniverl.cli.main import _demo_sentence, _teacher_heldout

WARM = {"solved": 2, "tasks": 24, "success_rate": 2 / 24}


def _events(run: Path, *records: dict[str, object]) -> Path:
    run.mkdir()
    (run / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_the_teacher_row_comes_from_the_last_teacher_event(tmp_path: Path) -> None:
    run = _events(
        tmp_path / "run",
        {"event": "run_start"},
        {"event": "toy_teacher_fitted", "heldout_success": 0.5},
        {"event": "toy_teacher_reused", "heldout_success": 0.958},
    )
    assert _teacher_heldout(run) == 0.958
    assert _teacher_heldout(_events(tmp_path / "none", {"event": "run_start"})) is None
    assert _teacher_heldout(tmp_path / "missing") is None


def test_the_sentence_says_which_way_the_counts_moved() -> None:
    up = _demo_sentence({"after_warmup": WARM, "final": {**WARM, "solved": 13}}, 0.958)
    assert up == (
        "OPD raised the student's held-out success (2/24 after the SFT warm-up, 13/24 after "
        "OPD); the teacher it distils from solves 96% of the same tasks."
    )
    same = _demo_sentence({"after_warmup": WARM, "final": WARM}, None)
    assert same == (
        "OPD did not change the student's held-out success (2/24 after the SFT warm-up, "
        "2/24 after OPD)."
    )
    down = _demo_sentence({"after_warmup": WARM, "final": {**WARM, "solved": 1}}, None)
    assert down is not None and down.startswith("OPD lowered")
    assert _demo_sentence({"final": WARM}, 0.9) is None
