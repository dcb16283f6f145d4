"""What a run prints: no per-cycle lines and no notice that needs no action unless
``--verbose``, and the result table last.

``rollouts_collected`` / ``cycle_end`` (about 800 lines in a 400-cycle demo) and the
``temperature_mismatch`` notice are echoed only with ``--verbose``; they are written to
``events.jsonl`` either way, and the notice says what to do if the user wants to change it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miniverl.cli.main import app

PER_CYCLE = ("rollouts_collected", "cycle_end")


@pytest.mark.parametrize("verbose", [False, True])
def test_offline_kd_reuse_is_a_per_cycle_line(
    tmp_path: Path, tiny_recipe: Path, verbose: bool
) -> None:
    """``offline_kd`` reuses its frozen pool every cycle after the first: one event a cycle,
    echoed only with ``--verbose`` (the demo's comparison arm printed 399 such lines)."""
    out = tmp_path / "run"
    args = ["train", str(tiny_recipe), "--output", str(out), "--no-report"]
    args += ["run.mode=offline_kd", "train.cycles=3"]
    result = CliRunner().invoke(app, [*args, *(["--verbose"] if verbose else [])])
    assert result.exit_code == 0, result.output
    echoed = [line for line in result.output.splitlines() if line.startswith("offline_kd_reuse")]
    assert len(echoed) == (2 if verbose else 0), result.output
    events = [json.loads(line)["event"] for line in (out / "events.jsonl").read_text().splitlines()]
    assert events.count("offline_kd_reuse") == 2


@pytest.mark.parametrize("verbose", [False, True])
def test_per_cycle_lines_only_with_verbose(
    tmp_path: Path, tiny_recipe: Path, verbose: bool
) -> None:
    out = tmp_path / "run"
    args = ["train", str(tiny_recipe), "--output", str(out), "--no-report", "train.cycles=2"]
    result = CliRunner().invoke(app, [*args, *(["--verbose"] if verbose else [])])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    echoed = [line for line in lines if line.split(" ")[0] in PER_CYCLE]
    assert len(echoed) == (4 if verbose else 0), result.output
    events = [json.loads(line)["event"] for line in (out / "events.jsonl").read_text().splitlines()]
    assert events.count("cycle_end") == 2 and events.count("rollouts_collected") == 2
    table_top = max(i for i, line in enumerate(lines) if "┏" in line)
    assert not any(
        line.split(" ")[0] in {"eval", "run_end", *PER_CYCLE} for line in lines[table_top:]
    )


@pytest.mark.parametrize("verbose", [False, True])
def test_the_temperature_note_is_echoed_only_with_verbose_and_says_what_to_do(
    tmp_path: Path, tiny_recipe: Path, verbose: bool
) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "train",
            str(tiny_recipe),
            "--output",
            str(out),
            "--no-report",
            "run.mode=opd",
            "rollout.temperature=0.5",
            "loss.temperature=1.0",
            *(["--verbose"] if verbose else []),
        ],
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    echoed = "temperature_mismatch" in text
    assert echoed == verbose, result.output
    if verbose:
        assert "not a fault" in text and "set loss.temperature=0.5" in text, result.output
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    notice = [e for e in events if e["event"] == "temperature_mismatch"]
    assert len(notice) == 1 and "set loss.temperature=0.5" in notice[0]["explanation"]
