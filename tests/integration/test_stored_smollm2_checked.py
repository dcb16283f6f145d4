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

from helpers import load_benchmark_script

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


def _probe_and_gate(
    pilot: str, name: str, seed: int = 1, run: str = ""
) -> tuple[str, dict[str, Any]]:
    """A stored probe output (benchmarks/teacher_recovery_probe.py) and the pilot's stored
    gate (under ``seed-N/<run>``), after checking the probe's first line reproduces the
    gate's figures."""
    text = (ROOT / pilot / name).read_text(encoding="utf-8")
    figures = json.loads(text.splitlines()[0])
    gate = _json(ROOT / pilot / f"seed-{seed}" / run / "teacher-state-gate.json")
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


def _recovery_episodes(text: str) -> list[tuple[str, bool, str, str]]:
    """``(episode id, solved, student turns, teacher's continuation)`` of each recovery
    episode of a stored probe output (benchmarks/teacher_recovery_probe.py)."""
    out = []
    for e in text.split("===== ")[1:]:
        head = e.split("\n", 1)[0]
        if ":recovery solved=" not in head:
            continue
        student = e.split("--- student:\n")[1].split("--- teacher's continuation:")[0]
        cont = e.split("--- teacher's continuation:\n")[1]
        out.append((head.split(":", 1)[0], head.endswith(" solved=True"), student, cont))
    return out


def _unsolved_recoveries(text: str) -> list[tuple[str, str, int]]:
    """``(student turns, teacher's continuation, where the continuation departs from the
    student's text)`` of each unsolved recovery episode of a stored probe output."""
    out = []
    for _, solved, student, cont in _recovery_episodes(text):
        if solved:
            continue
        cut = next((i for i, (a, b) in enumerate(zip(cont, student, strict=False)) if a != b), 0)
        out.append((student, cont, cut))
    return out


def _failed_recoveries(text: str) -> list[tuple[str, str]]:
    """``(student turns, what the teacher wrote itself)`` of each unsolved recovery episode."""
    return [(student, cont[cut:]) for student, cont, cut in _unsolved_recoveries(text)]


def test_pilot_5_teacher_3_fitted_on_the_students_states_fails_its_gate() -> None:
    """Teacher 3 (fitted in the cold start on oracle, corrective and the seed's own labelled
    states), gated on seed 3, a cold start no gate had seen: both bars fail, no arm ran."""
    fifth = ROOT / "pilot-5"
    gate = _json(fifth / "seed-3" / "cold-start-run" / "teacher-state-gate.json")
    assert gate["privileged_rule"] == "teacher_departs"
    for phrase in _state_gate_line(gate):
        assert phrase in LOG, phrase
    assert gate["failures"] == ["off_path_agreement 0.875 < 0.900", "recovery_rate 0.476 < 0.800"]
    assert (gate["recovered"], gate["recovery_states"], gate["tasks"]) == (10, 21, 90)
    fit = _json(fifth / "teacher-adapter-fit.json")
    settings = fit["payload"]["fit"]
    assert (settings["steps"], settings["batch_size"], settings["lr"]) == (120, 8, 0.001)
    assert settings["dagger"]["enabled"] and settings["extra_tasks"] == 0
    assert (fit["payload"]["lora"]["r"], fit["payload"]["lora"]["alpha"]) == (32, 64.0)
    assert fit["payload"]["seed"] == 3
    rows = (fit["oracle_traces"], fit["corrective_traces"], fit["dagger_states"])
    assert rows == (240, 120, 470) and fit["cost"]["examples"] == sum(rows) == 830
    assert fit["dagger_off_path_states"] == 73 and fit["dagger_solved"] == 60
    assert "830 rows (240 oracle traces, 120 corrective, 470 labelled states" in LOG
    record = _json(fifth / "seed-3" / "cold-start" / "cold_start.json")
    assert record["teacher_adapter"]["adapter_sha256"] == fit["adapter_sha256"]
    assert f"`{fit['adapter_sha256'][:8]}…`" in LOG
    cells = [
        _json(ROOT / p / "cells" / f"s{s}-a0-cold-start.json")["payload"]
        for p, s in (("pilot-3", 1), ("pilot-4", 2), ("pilot-5", 3))
    ]
    assert len({c["student_sha256"] for c in cells}) == 3  # a third student
    assert f"`{cells[2]['student_sha256'][:8]}…`" in LOG
    assert round(cells[2]["after_warmup_success"] * 90) == 30
    assert cells[2]["teacher_gate"]["states"]["failures"] == gate["failures"]
    assert sorted(p.name for p in (fifth / "cells").iterdir()) == ["s3-a0-cold-start.json"]
    turn_starts = _json(fifth / "seed-3" / "cold-start" / "teacher-gate.json")
    assert (turn_starts["correct"], turn_starts["actions"]) == (167, 178)
    assert (turn_starts["off_path_correct"], turn_starts["off_path_actions"]) == (21, 23)
    assert "Turn-start gate 0.938 (167 of 178; 21 of 23 off the oracle's path)" in LOG


def test_pilot_5s_probes_teacher_3_makes_the_named_call_then_fails_on_the_path() -> None:
    """``pilot-5/teacher-probe.txt`` reproduces teacher 3's gate: in 10 of its 11 unsolved
    recoveries its first own call is the step the flag names. ``teacher-2-probe.txt``: teacher
    2 at the same states recovers in 21 of 21."""
    text, gate = _probe_and_gate("pilot-5", "teacher-probe.txt", seed=3, run="cold-start-run")
    failed = _failed_recoveries(text)
    assert len(failed) == gate["recovery_states"] - gate["recovered"] == 11
    named_first = 0
    for student, own in failed:
        named = re.findall(r"the next step is (-?\d+ [-+*] -?\d+)", student)
        calls = re.findall(r'"expression": "([^"]*)"', own)
        named_first += bool(named and calls and calls[0] == named[-1])
    assert named_first == 10
    assert "in 10 its first own turn is exactly the step the flag names" in LOG
    other = json.loads((ROOT / "pilot-5" / "teacher-2-probe.txt").read_text().splitlines()[0])
    assert (other["recovered"], other["recovery_states"]) == (21, 21)
    assert other["on_path_agreement"] == 1.0 and round(other["off_path_agreement"], 3) == 0.943
    assert "on the path 1.000, after a deviation 0.943, recovery **21 of 21**" in " ".join(
        LOG.split()
    )


def test_pilot_6_teacher_4_passes_its_gate_at_seeds_2_and_4() -> None:
    """Teacher 4 (teacher 2's adapter fitted further, inside each seed's cold start, on oracle,
    corrective and that seed's labelled states): both held-out state gates pass; seed 2's cold
    start is pilot 4's, where teacher 2 failed, so the two teachers are scored at one student."""
    sixth = ROOT / "pilot-6"
    expected = {2: (46, 50, 608, 183, 968), 4: (31, 36, 406, 72, 766)}
    for seed, (recovered, deviated, states, off_path, rows) in expected.items():
        gate = _json(sixth / f"seed-{seed}" / "cold-start-run" / "teacher-state-gate.json")
        assert gate["privileged_rule"] == "teacher_departs" and gate["tasks"] == 90
        assert gate["passed"] and gate["failures"] == []
        assert gate["on_path_agreement"] == 1.0 and gate["off_path_agreement"] >= 0.9
        assert (gate["recovered"], gate["recovery_states"]) == (recovered, deviated)
        for phrase in _state_gate_line(gate):
            assert phrase in LOG, phrase
        fit = _json(sixth / f"teacher-adapter-fit-s{seed}.json")
        settings = fit["payload"]["fit"]
        assert (settings["steps"], settings["batch_size"], settings["lr"]) == (60, 8, 0.001)
        assert settings["dagger"]["enabled"] and fit["payload"]["seed"] == seed
        assert fit["payload"]["init_sha256"] == fit["init_from"]["sha256"]
        assert fit["init_from"]["sha256"].startswith("50d61ce5")  # teacher 2's adapter
        assert (fit["dagger_states"], fit["dagger_off_path_states"]) == (states, off_path)
        assert fit["cost"]["examples"] == 240 + 120 + states == rows
        record = _json(sixth / f"seed-{seed}" / "cold-start" / "cold_start.json")
        assert record["teacher_adapter"]["adapter_sha256"] == fit["adapter_sha256"]
        assert f"`{fit['adapter_sha256'][:8]}…`" in LOG
        cell = _json(sixth / "cells" / f"s{seed}-a0-cold-start.json")["payload"]
        assert cell["teacher_gate"]["passed"] is True
        assert cell["teacher_gate"]["states"]["failures"] == []
        assert f"`{cell['student_sha256'][:8]}…`" in LOG
    same = [
        _json(ROOT / p / "cells" / "s2-a0-cold-start.json")["payload"]["student_sha256"]
        for p in ("pilot-4", "pilot-6")
    ]
    assert same[0] == same[1]
    before = _json(ROOT / "pilot-4" / "seed-2" / "teacher-state-gate.json")
    assert (before["recovered"], before["recovery_states"]) == (31, 50)
    assert sorted(p.name for p in (sixth / "cells").iterdir()) == [
        "s2-a0-cold-start.json",
        "s4-a0-cold-start.json",
    ]


def _teachers_first_turns(text: str) -> list[tuple[str, str]]:
    """``(student turns, the teacher's first turn of its own)`` of each unsolved recovery: the
    whole assistant turn in which the continuation first departs from the student's text."""
    head = "<|im_start|>assistant\n"
    out = []
    for student, cont, cut in _unsolved_recoveries(text):
        begin = cont.rfind(head, 0, cut + 1)
        begin = 0 if begin < 0 else begin + len(head)
        out.append((student, cont[begin:].split("<|im_end|>")[0]))
    return out


def test_pilot_6s_probes_teacher_4_mostly_makes_the_named_call_and_fails_later() -> None:
    """``pilot-6/teacher-probe-sN.txt`` reproduce the two gates; in each unsolved recovery the
    teacher's first own turn is a well-formed call of the step the flag names or not (seed 2: 2
    of 4; seed 4: 4 of 5), the figures the LOG gives."""
    call = re.compile(
        r'^<tool_call>\n\{"arguments": \{"expression": "([^"]*)"\}, "name": "calculator"\}\n</tool_call>$'
    )
    for seed, (unsolved, named_first) in {2: (4, 2), 4: (5, 4)}.items():
        text, gate = _probe_and_gate(
            "pilot-6", f"teacher-probe-s{seed}.txt", seed=seed, run="cold-start-run"
        )
        turns = _teachers_first_turns(text)
        assert len(turns) == gate["recovery_states"] - gate["recovered"] == unsolved
        first = 0
        for student, turn in turns:
            named = re.findall(r"the next step is (-?\d+ [-+*] -?\d+)", student)
            made = call.match(turn.strip())
            first += bool(named and made and made.group(1) == named[-1])
        assert first == named_first, seed
    assert (
        "Of seed 2's 4 unsolved recoveries, in 2 the teacher's first own turn is a well-formed call"
        in LOG
    )
    assert "Of seed 4's 5, in 4 its first own turn is a well-formed call of the named step" in LOG


SEVENTH = ROOT / "pilot-7"
STATE_PROBES = {
    "cold start": ("state-probe-cold-start.txt", 0),
    "`opd`, step 40": ("state-probe-opd-c40.txt", 11),
    "`offline_kd`, step 40": ("state-probe-offline_kd-c40.txt", 3),
    "`opd`, step 80": ("state-probe-opd-final.txt", 27),
    "`offline_kd`, step 80": ("state-probe-offline_kd-final.txt", 3),
}


def _pilot_7_rows() -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
    """``(run, tag) -> (the LOG's table row, summary)``, recomputed from the stored episodes."""
    summarize = load_benchmark_script("run_endpoints").summarize_compact
    rows = {}
    for run, tags in _json(SEVENTH / "episodes.json")["runs"].items():
        label = "cold start" if "cold-start" in run else Path(run).name
        for tag, entry in tags.items():
            s = summarize(entry["episodes"])
            n, flagged = s["episodes"], s["flagged_episodes"]
            ks = " | ".join(f"{v:.3f}" for v in s["success_by_k"].values())
            row = (
                f"| {label} | {entry['step']} | {round(s['success'] * n)}/{n} | {ks} | {flagged} "
                f"| {round((s['flagged_recovery_rate'] or 0) * flagged)} |"
            )
            rows[(label, tag)] = (row, s)
    return rows


def test_pilot_7_curves_are_recomputed_from_the_stored_episodes() -> None:
    """Every row of pilot 7's table is the endpoints of the stored episodes of one evaluation;
    the cold start is pilot 6's seed 4 (30 of 90, 4 flagged), both arms ran 80 steps."""
    rows = _pilot_7_rows()
    for (label, tag), (row, _) in rows.items():
        if (label, tag) != ("cold start", "final"):  # the same evaluation as after_warmup
            assert row in LOG, row
    cold = rows[("cold start", "after_warmup")][1]
    assert (cold["episodes"], round(cold["success"] * 90), cold["flagged_episodes"]) == (90, 30, 4)
    steps = {
        label: [e["step"] for e in tags.values()]
        for label, tags in (
            (Path(r).name, t) for r, t in _json(SEVENTH / "episodes.json")["runs"].items()
        )
    }
    assert steps["opd"] == steps["offline_kd"] == [10, 20, 30, 40, 50, 60, 70, 80]
    assert round(rows[("offline_kd", "final")][1]["success"] * 90) == 89


def test_pilot_7_probes_put_every_policy_at_the_cold_starts_own_deviations() -> None:
    """Each state probe is the held-out state gate's recovery with one policy in the
    teacher's place: the same 36 deviated episodes of the cold-start student for all of them,
    and the recovered counts the LOG gives."""
    episodes = None
    for label, (name, expected) in STATE_PROBES.items():
        text = (SEVENTH / name).read_text(encoding="utf-8")
        figures = json.loads(text.splitlines()[0])
        solved = [(tid, ok) for tid, ok, _, _ in _recovery_episodes(text)]
        assert len(solved) == figures["recovery_states"] == 36, name
        assert sum(ok for _, ok in solved) == figures["recovered"], name
        if expected is not None:
            assert figures["recovered"] == expected, name
        ids = sorted(tid for tid, _ in solved)
        assert episodes is None or ids == episodes, name
        episodes = ids
        assert f"| {label} | {figures['recovered']} of 36 | `pilot-7/{name}` |" in LOG, label


def test_pilot_7_defect_checks_are_the_stored_outputs() -> None:
    overfit = (SEVENTH / "recovery-overfit-s4.txt").read_text(encoding="utf-8")
    assert "6 of 16 student episodes have a refused call; 77 targeted positions" in overfit
    assert "before: top-1 agreement 69/77 (0.896); corrective turns reproduced 0/6" in overfit
    assert "after 30 passes: top-1 agreement 77/77 (1.000); corrective turns reproduced 6/6" in (
        overfit
    )
    assert "loss 0.343 -> 0.004 nats/token over 30 steps" in overfit
    audit = " ".join((SEVENTH / "teacher-audit-opd.txt").read_text(encoding="utf-8").split())
    assert "160 student rollouts re-scored" in audit
    assert "on_path positions 6888 targeted 6888 untargeted 0 agreement 0.999 of 6888 EOS 0" in (
        audit
    )
    assert (
        "after_error positions 1785 targeted 1785 untargeted 0 agreement 0.979 of 1785 EOS 0"
        in (audit)
    )
    for phrase in (
        "at the 77 targeted positions after it the student's top-1 is the teacher's at 69",
        "0.999 of 6,888 positions on the oracle's path and 0.979 of 1,785",
    ):
        assert phrase in LOG, phrase


def test_pilot_7s_unterminated_blocks_are_where_the_arms_differ() -> None:
    """30 of the 36 states follow a ``<tool_call>`` block the cold start closed with
    ``</final>``; recoveries there: ``opd`` 10 (step 40) and 24 (step 80), ``offline_kd`` 3 and 3."""
    expected = {
        "state-probe-opd-c40.txt": 10,
        "state-probe-opd-final.txt": 24,
        "state-probe-offline_kd-c40.txt": 3,
        "state-probe-offline_kd-final.txt": 3,
        "state-probe-cold-start.txt": 0,
    }
    for name, recovered in expected.items():
        text = (SEVENTH / name).read_text(encoding="utf-8")
        flags = [
            (solved, re.findall(r'"error": "([^"]*)', student))
            for _, solved, student, _ in _recovery_episodes(text)
        ]
        unterminated = [s for s, errors in flags if errors and "unterminated" in errors[-1]]
        assert len(flags) == 36 and len(unterminated) == 30, name
        assert sum(unterminated) == recovered, name
    assert "`opd` recovers 10 at step 40 and 24 at step 80, `offline_kd` 3 at both" in LOG


def _protocol_overrides(text: str, start: str, end: str) -> list[str]:
    """The dotted overrides the frozen protocol's comments give between two markers."""
    block = text[text.index(start) + len(start) : text.index(end, text.index(start))]
    found = re.findall(r"(?<![\w.])((?:models|train|eval)\.[\w.]+=\S+)", block)
    return [o.rstrip(".,") for o in found]


def test_the_arms_protocol_is_frozen_and_its_commands_load() -> None:
    """``test/protocol.yaml`` is the frozen bytes; it fits the four arms at seeds 11-15 with
    ``fixed_recovery`` primary; the grid and test commands it gives validate and train the same
    way, so ``--lr-from`` will accept the grid."""
    from miniverl.lab.benchmark.lr_grid import training_digest
    from miniverl.lab.benchmark.protocol import freeze_protocol, primary_endpoints
    from miniverl.lab.config import load_recipe

    test = ROOT / "test"
    arms = ["opd", "offline_kd", "sft_corrective", "opd_self"]
    frozen = freeze_protocol(test, test / "protocol.yaml", seeds=[11, 12, 13, 14, 15], arms=arms)
    assert frozen is not None and frozen["frozen_at"] == "2026-12-07T10:34:16+00:00"
    assert primary_endpoints(frozen["content"]) == ["fixed_recovery", None]
    assert frozen["content"]["primary_contrasts"] == [["opd", "offline_kd"]]
    assert frozen["sha256"][:8] in LOG and frozen["frozen_at"][11:19] in LOG
    text = (test / "protocol.yaml").read_text(encoding="utf-8")
    teacher = _protocol_overrides(text, "TEACHER =", "(teacher 4")
    common = _protocol_overrides(text, "ARMS =", "# Arms:")
    on_test = _protocol_overrides(text, "# Test:", "--arms")
    assert len(teacher) == 11 and common == ["train.cycles=80", "eval.baseline=false"]
    assert on_test == [
        "eval.split=test",
        "eval.max_tasks=100",
        "eval.every=40",
        "eval.fixed_state_recovery=true",
    ]
    recipe = ROOT.parents[1] / "recipes" / "smollm2_calc_chain_checked.yaml"
    grid = load_recipe(recipe, [*teacher, *common])
    run = load_recipe(recipe, [*teacher, *common, *on_test])
    assert run.lab.fixed_state_recovery and run.eval.split == "test"
    assert training_digest(grid.to_dict()) == training_digest(run.to_dict())


def test_seed_4s_chain_rebuilt_gives_the_same_bytes_and_pilot_7s_fixed_states() -> None:
    """Teacher 2 and seed 4's gated cold start, rebuilt from the committed recipes, are pilot
    6's bytes with pilot 6's gate; the benchmark's fixed states (``eval.fixed_state_recovery``)
    are the 36 deviated episodes pilot 7's probes continued from, in the same order, and the
    cold start's own continuation ends as the probe's did at every one of them."""
    from miniverl.trajectory.io import read_trajectories
    from miniverl.utils.hashing import sha256_file

    repro, sixth = ROOT / "repro-s4", ROOT / "pilot-6"
    cell = _json(repro / "cells" / "s4-a0-cold-start.json")["payload"]
    before = _json(sixth / "cells" / "s4-a0-cold-start.json")["payload"]
    assert cell["student_sha256"] == before["student_sha256"]
    record = _json(repro / "seed-4" / "cold-start" / "cold_start.json")
    fit = _json(sixth / "teacher-adapter-fit-s4.json")
    assert record["teacher_adapter"]["adapter_sha256"] == fit["adapter_sha256"]
    assert record["teacher_adapter"]["init_from"]["sha256"] == fit["init_from"]["sha256"]
    gate = _json(repro / "seed-4" / "cold-start-run" / "teacher-state-gate.json")
    old = _json(sixth / "seed-4" / "cold-start-run" / "teacher-state-gate.json")
    for key in ("on_path_correct", "off_path_correct", "recovered", "recovery_states", "passed"):
        assert gate[key] == old[key], key
    fixed = cell["fixed_states"]
    path = repro / "seed-4" / "cold-start" / fixed["file"]
    assert sha256_file(path) == fixed["sha256"]
    assert (fixed["split"], fixed["tasks"], fixed["episodes"]) == ("eval", 90, 90)
    stored = [t.trajectory_id for t in read_trajectories(path)]
    outcomes = fixed["cold_start"]["outcomes"]
    assert [o["trajectory_id"] for o in outcomes] == stored and len(stored) == 36
    probe = (ROOT / "pilot-7" / "state-probe-cold-start.txt").read_text(encoding="utf-8")
    continued = re.findall(r"^===== (\S+):recovery solved=(True|False)$", probe, re.M)
    assert [(tid, int(s == "True")) for tid, s in continued] == [
        (o["trajectory_id"], o["solved"]) for o in outcomes
    ]
    assert fixed["cold_start"]["recovered"] == 0
    for phrase in (
        f"`{cell['student_sha256'][:8]}…`",
        f"`{fit['adapter_sha256'][:8]}…`",
        f"{cell['cpu_seconds']:,.0f} CPU-s",
    ):
        assert phrase in LOG, phrase


def test_pilot_7_rerun_from_the_rebuilt_cold_start_evaluates_the_same_episodes() -> None:
    """``opd`` and ``offline_kd`` run again from the rebuilt seed-4 cold start with pilot 7's
    commands, stopped after step 20: all 360 evaluated episodes equal pilot 7's."""
    rerun = _json(ROOT / "repro-s4" / "pilot-7-episodes-steps-10-20.json")["runs"]
    stored = _json(ROOT / "pilot-7" / "episodes.json")["runs"]
    for arm in ("opd", "offline_kd"):
        again, before = rerun[f"runs/smol-p7r-s4/{arm}"], stored[f"runs/smol-pilot7-s4/{arm}"]
        assert sorted(again) == ["cycle-0009", "cycle-0019"]
        for tag, evaluation in again.items():
            assert len(evaluation["episodes"]) == 90
            assert evaluation == before[tag], (arm, tag)
