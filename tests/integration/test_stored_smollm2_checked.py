"""The SmolLM2 positive control's stored gate figures are the ones its LOG and the docs quote.

``results/smollm2_checked/pilot-*/`` hold what each pilot's benchmark wrote (cells, the plan,
the cold start's records, the held-out state gate); no weights are stored, their SHA-256 is in
the cells. Every figure the LOG quotes is read back from these files here.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2] / "results" / "smollm2_checked"
LOG = " ".join((ROOT / "LOG.md").read_text(encoding="utf-8").split())


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _state_gate_line(gate: dict[str, Any]) -> list[str]:
    """The LOG's phrasing of a held-out state gate's three figures."""
    on, off = gate["on_path_correct"], gate["off_path_correct"]
    return [
        f"**{gate['on_path_agreement']:.3f}** ({on:,} of {gate['on_path_positions']:,} positions",
        f"**{gate['off_path_agreement']:.3f}** ({off} of {gate['off_path_positions']}, "
        f"{gate['privileged_predictions']} of them "
        + ("a prediction" if gate["privileged_predictions"] == 1 else "predictions")
        + " of a number the transcript does not hold",
        f"**{gate['recovery_rate']:.3f}** (the teacher's own greedy continuation solves "
        f"{gate['recovered']} of the {gate['recovery_states']} deviated episodes",
    ]


def _probe_and_gate(pilot: str, name: str, seed: int = 1) -> tuple[str, dict[str, Any]]:
    """A stored probe output (benchmarks/teacher_recovery_probe.py) and the pilot's stored
    gate, after checking the probe's first line reproduces the gate's figures."""
    text = (ROOT / pilot / name).read_text(encoding="utf-8")
    figures = json.loads(text.splitlines()[0])
    gate = _json(ROOT / pilot / f"seed-{seed}" / "teacher-state-gate.json")
    for key in ("on_path_agreement", "off_path_agreement", "recovered", "recovery_states"):
        assert figures[key] == gate[key], key
    return text, gate


def test_pilot_1_gate_figures_are_the_stored_ones() -> None:
    pilot = ROOT / "pilot-1"
    gate = _json(pilot / "seed-1" / "teacher-state-gate.json")
    for phrase in _state_gate_line(gate):
        assert phrase in LOG, phrase
    assert gate["failures"] == ["off_path_agreement 0.848 < 0.900"] and not gate["passed"]
    assert gate["tasks"] == 30 and gate["temperature"] == 1.0
    cell = _json(pilot / "cells" / "s1-a0-cold-start.json")["payload"]
    recorded = cell["teacher_gate"]
    assert recorded["passed"] is False and recorded["states"]["failures"] == gate["failures"]
    assert recorded["states"]["recovery_rate"] == gate["recovery_rate"]
    turn_starts = _json(pilot / "seed-1" / "cold-start" / "teacher-gate.json")
    assert turn_starts["passed"] is True and (turn_starts["correct"], turn_starts["actions"]) == (
        65,
        66,
    )
    assert "0.985 (65 of 66 student-visited turn starts)" in LOG
    assert f"greedy validation success {round(cell['after_warmup_success'] * 30)}/30" in LOG
    assert not (pilot / "cells" / "s1-a0-opd.json").exists()  # refused before any arm


def test_pilot_2_gate_figures_are_the_stored_ones_and_its_cold_start_is_pilot_1s() -> None:
    first, second = ROOT / "pilot-1", ROOT / "pilot-2"
    gate = _json(second / "seed-1" / "teacher-state-gate.json")
    for phrase in _state_gate_line(gate):
        assert phrase in LOG, phrase
    assert gate["failures"] == ["off_path_agreement 0.897 < 0.900", "recovery_rate 0.571 < 0.800"]
    turn_starts = _json(second / "seed-1" / "cold-start" / "teacher-gate.json")
    assert (turn_starts["correct"], turn_starts["actions"]) == (63, 66)
    assert "Turn-start gate 0.955 (63 of 66)" in LOG
    cells = [_json(p / "cells" / "s1-a0-cold-start.json")["payload"] for p in (first, second)]
    assert cells[0]["student_sha256"] == cells[1]["student_sha256"]  # "byte-identical"
    assert not (second / "cells" / "s1-a0-opd.json").exists()
    teachers = [
        _json(p / "seed-1" / "teacher-checkpoint.json")["teacher_checkpoint"]
        for p in (first, second)
    ]
    assert teachers[0]["path"].endswith("cycle-0059") and teachers[1]["path"] == "runs/smol-teacher"
    for teacher in teachers:
        assert f"`{teacher['sha256'][:8]}…`" in LOG


def test_the_recovery_probe_reproduces_pilot_2s_gate_and_names_the_failures() -> None:
    """``pilot-2/recovery-probe.txt`` is benchmarks/teacher_recovery_probe.py's output."""
    text, gate = _probe_and_gate("pilot-2", "recovery-probe.txt")
    episodes = text.split("===== ")[1:]
    failed = [e for e in episodes if e.split("\n", 1)[0].endswith("solved=False")]
    assert len(episodes) == gate["recovery_states"] and len(failed) == 3
    assert "Recovered (4)" in LOG and "Not recovered (3)" in LOG
    flags = [e.split("--- teacher's continuation:")[1] for e in failed]
    assert sum('tool call needs a string \\"name\\"' in f for f in flags) == 1
    assert sum("every step is done: give the final answer" in f for f in flags) == 2


def test_pilot_3_gate_figures_are_the_stored_ones_and_recovery_passes() -> None:
    """Teacher 2 (corrective traces for every flag) on the 90-task validation split: the
    same cold start as pilots 1 and 2, recovery passes, the off-path bar fails, no arm ran."""
    first, third = ROOT / "pilot-1", ROOT / "pilot-3"
    gate = _json(third / "seed-1" / "teacher-state-gate.json")
    for phrase in _state_gate_line(gate):
        assert phrase in LOG, phrase
    assert gate["tasks"] == 90 and gate["episodes"] == 90
    assert gate["failures"] == ["off_path_agreement 0.811 < 0.900"]
    assert gate["recovered"] == gate["recovery_states"] == 10
    labelled = [r for r in gate["per_turn"] if r["off_path"]]
    assert sum(r["labelled"] for r in labelled) == sum(r["correct"] for r in labelled) == 43
    privileged = [r for r in gate["per_turn"] if r["privileged"]]
    assert sum(r["privileged"] for r in privileged) == gate["privileged_predictions"] == 10
    assert len({r["task_id"] for r in privileged}) == 8
    assert sum(r["privileged"] for r in privileged if not r["off_path"]) == 8
    assert (
        "every labelled position after a deviation agrees with the oracle's label (43 of 43)" in LOG
    )
    turn_starts = _json(third / "seed-1" / "cold-start" / "teacher-gate.json")
    assert (turn_starts["correct"], turn_starts["actions"]) == (200, 200)
    assert "Turn-start gate 1.000 (200 of 200; 10 of 10 off the oracle's path)" in LOG
    cells = [_json(p / "cells" / "s1-a0-cold-start.json")["payload"] for p in (first, third)]
    assert cells[0]["student_sha256"] == cells[1]["student_sha256"]
    assert round(cells[1]["after_warmup_success"] * 90) == 30 and "30/90 validation tasks" in LOG
    assert not (third / "cells" / "s1-a0-opd.json").exists()
    teacher = _json(third / "seed-1" / "teacher-checkpoint.json")["teacher_checkpoint"]
    assert teacher["path"] == "runs/smol-teacher" and f"`{teacher['sha256'][:8]}…`" in LOG


def _chain_values(task: str) -> list[int]:
    """Every value of a calc_chain task ("Start with 95. Then subtract 39, then multiply by 6.")."""
    start = re.search(r"Start with (-?\d+)\.", task)
    assert start, task
    values = [int(start.group(1))]
    for verb, number in re.findall(r"(add|subtract|multiply by) (-?\d+)", task):
        n = int(number)
        values.append(
            values[-1] + n
            if verb == "add"
            else values[-1] - n
            if verb == "subtract"
            else values[-1] * n
        )
    return values


def test_pilot_3s_privileged_predictions_extend_the_students_own_wrong_numbers() -> None:
    """``pilot-3/teacher-probe.txt`` is benchmarks/teacher_recovery_probe.py's output: it
    reproduces the stored gate, and each of its 10 privileged predictions is a digit that
    continues a number the student had already begun in its turn, which is none of the
    task's values (so not the answer or a step the teacher worked out unseen)."""
    text, gate = _probe_and_gate("pilot-3", "teacher-probe.txt")
    blocks = text.split("===== privileged prediction\n")[1:]
    assert len(blocks) == gate["privileged_predictions"] == 10
    for block in blocks:
        tasks = re.findall(r"Start with [^\n]*?Report the final value\.", block)
        so_far = ast.literal_eval(re.search(r"--- the student's turn so far: (.*)\n", block)[1])
        predicted = ast.literal_eval(
            re.search(r"--- the teacher's top-1 next token: (.*)\n", block)[1]
        )
        begun = re.search(r"\d+$", so_far)
        assert predicted.isdigit() and begun, (so_far, predicted)
        written = begun.group() + predicted
        values = [str(abs(v)) for v in _chain_values(tasks[-1])]
        assert not any(v.startswith(written) for v in values), (written, values)
    assert "each of the 10 continues a number the student had already begun" in LOG


def test_pilot_4_gate_under_the_rule_written_before_it_fails_on_recovery() -> None:
    """Seed 2's cold start, gated under ``teacher_departs`` (set in the recipe before this gate
    ran): the off-path bar passes, recovery fails on 50 deviated episodes, no arm ran."""
    third, fourth = ROOT / "pilot-3", ROOT / "pilot-4"
    gate = _json(fourth / "seed-2" / "teacher-state-gate.json")
    assert gate["privileged_rule"] == "teacher_departs"
    for phrase in _state_gate_line(gate):
        assert phrase in LOG, phrase
    assert gate["failures"] == ["recovery_rate 0.620 < 0.800"] and not gate["passed"]
    assert (gate["recovered"], gate["recovery_states"], gate["tasks"]) == (31, 50, 90)
    cells = [
        _json(p / "cells" / f"s{s}-a0-cold-start.json")["payload"]
        for p, s in ((third, 1), (fourth, 2))
    ]
    assert cells[0]["student_sha256"] != cells[1]["student_sha256"]  # a cold start never gated
    assert round(cells[1]["after_warmup_success"] * 90) == 28 and "28/90 validation tasks" in LOG
    assert cells[1]["teacher_gate"]["states"]["failures"] == gate["failures"]
    assert not list((fourth / "cells").glob("s2-a0-opd*")) and not list(
        (fourth / "cells").glob("s2-a0-offline_kd*")
    )
    teachers = [
        _json(p / f"seed-{s}" / "teacher-checkpoint.json")["teacher_checkpoint"]["sha256"]
        for p, s in ((third, 1), (fourth, 2))
    ]
    assert teachers[0] == teachers[1]  # teacher 2 both times
    turn_starts = _json(fourth / "seed-2" / "cold-start" / "teacher-gate.json")
    assert (turn_starts["correct"], turn_starts["actions"]) == (197, 220)
    assert (turn_starts["off_path_correct"], turn_starts["off_path_actions"]) == (35, 57)
    assert "Turn-start gate 0.895 (197 of 220; 35 of 57 off the oracle's path)" in LOG


def test_pilot_4s_probe_names_the_flags_the_teacher_does_not_recover_from() -> None:
    """``pilot-4/teacher-probe.txt``: of the 19 deviated episodes the teacher does not solve,
    11 start from a call whose expression is the word "calculator", which it copies."""
    text, gate = _probe_and_gate("pilot-4", "teacher-probe.txt", seed=2)
    episodes = [e for e in text.split("===== ")[1:] if ":recovery solved=" in e.split("\n", 1)[0]]
    failed = [e for e in episodes if e.split("\n", 1)[0].endswith("solved=False")]
    assert len(episodes) == gate["recovery_states"] == 50
    assert len(failed) == gate["recovery_states"] - gate["recovered"] == 19
    students = [
        e.split("--- student:\n")[1].split("--- teacher's continuation:")[0] for e in failed
    ]
    named = ["got 'calculator'" in s for s in students]
    unterminated = ["unterminated <tool_call> block" in s for s in students]
    wrong_step = ["wrong step; the next step is" in s for s in students]
    assert (sum(named), sum(unterminated), sum(wrong_step)) == (11, 3, 3)
    continuations = [e.split("--- teacher's continuation:\n")[1] for e in failed]
    own = [  # what the teacher wrote itself, after the replayed student turns
        c[next((i for i, (a, b) in enumerate(zip(c, s, strict=False)) if a != b), len(c)) :]
        for c, s in zip(continuations, students, strict=True)
    ]
    assert all('"expression": "calculator"' in o for o, n in zip(own, named, strict=True) if n)
    assert "11 of the 19 start from a call whose expression is the word `calculator`" in LOG
