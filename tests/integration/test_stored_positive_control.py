"""Every figure results/positive_control/LOG.md quotes, recomputed from the stored artifacts.

``context-pilot/cells/`` are benchmark cell records (their payload SHA-256 is checked, so an
edited cell fails); ``turn-only-pilot/seed-N/`` holds a training run's ``eval.json`` and greedy
evaluation trajectories, from which the calc_chain endpoints are recomputed here with the
run's own config. The LOG's table rows and contrast lines are rebuilt here and must appear in
it verbatim.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miniverl.cli.main import app
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.lab.benchmark.cell_runner import _eval_trajectories, chain_endpoints
from miniverl.lab.benchmark.cells import _digest
from miniverl.lab.benchmark.stats import t_interval, t_test_p
from miniverl.lab.config import LabRunConfig

ROOT = Path(__file__).resolve().parents[2] / "results" / "positive_control"
LOG = (ROOT / "LOG.md").read_text(encoding="utf-8")
SEEDS = sorted(int(p.name.split("-")[1]) for p in (ROOT / "context-pilot").glob("seed-*"))
TASKS = 60


def _cell(seed: int, name: str) -> dict[str, Any]:
    path = ROOT / "context-pilot" / "cells" / f"s{seed}-a0-{name}.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    assert _digest(record["payload"]) == record["payload_sha256"], f"{path} edited"
    return record["payload"]


def _turn_only(seed: int) -> tuple[int, dict[str, Any]]:
    run = ROOT / "turn-only-pilot" / f"seed-{seed}"
    config = LabRunConfig.from_yaml(run / "config.original.yaml")
    assert config.lab.oracle_teacher.off_path == "turn_only"
    env = make_environment(config.environment.name, **config.environment.params)
    splits = build_splits(env, config.environment)
    tasks = {t.task_id: t for split in splits.values() for t in split}
    final = chain_endpoints(_eval_trajectories(run)["final"], tasks)
    assert final is not None
    stored = json.loads((run / "eval.json").read_text(encoding="utf-8"))["final"]
    assert stored["tasks"] == TASKS == final["episodes"]
    assert round(final["success"] * final["episodes"]) == stored["solved"]
    return stored["solved"], final


def _text(solved: int, endpoints: dict[str, Any]) -> str:
    by_k = " / ".join(f"{endpoints['success_by_k'][k]:.2f}" for k in ("1", "2", "3"))
    return f"{solved}/{TASKS} ({by_k}; {endpoints['result_copy_accuracy']:.3f})"


@functools.cache
def _row(seed: int) -> tuple[str, dict[str, int]]:
    """The LOG's table row for ``seed`` and the solved counts of its four columns."""
    start = _cell(seed, "cold-start")["start_endpoints"]
    cold = round(start["success"] * start["episodes"])
    offline, opd = _cell(seed, "offline_kd"), _cell(seed, "opd")
    assert opd["arm_overrides"] == ["run.mode=opd", "loss.divergence=forward_kl"]
    turn_solved, turn = _turn_only(seed)
    for endpoints in (offline["endpoints"], opd["endpoints"], turn):
        assert endpoints["recovery_rate"] == 0.0  # the LOG: "0.0 in every cell"
    cells = [
        _text(cold, start),
        _text(offline["final_solved"], offline["endpoints"]),
        _text(opd["final_solved"], opd["endpoints"]),
        _text(turn_solved, turn),
    ]
    solved = {
        "cold start": cold,
        "offline_kd": offline["final_solved"],
        "context": opd["final_solved"],
        "turn_only": turn_solved,
    }
    return f"| {seed} | " + " | ".join(cells) + " |", solved


def _contrast(name: str, diffs: list[float]) -> str:
    low, high = t_interval(diffs)
    mean = sum(diffs) / len(diffs)
    return (
        f"`opd` with `{name}` − `offline_kd`: {mean:+.1f} pp, 95% t-interval [{low:+.1f}, {high:+.1f}] "
        f"over {len(diffs)} seeds, p = {t_test_p(diffs):.3f}"
    )


def test_every_table_row_recomputes() -> None:
    assert SEEDS == [1, 2, 3, 4, 5]
    for seed in SEEDS:
        row, _ = _row(seed)
        assert row in LOG, row


def test_the_contrasts_recompute() -> None:
    solved = [_row(seed)[1] for seed in SEEDS]
    for arm in ("turn_only", "context"):
        diffs = [100.0 * (s[arm] - s["offline_kd"]) / TASKS for s in solved]
        line = _contrast(arm, diffs)
        assert line in LOG, line


def test_the_turn_only_runs_differ_from_the_opd_cell_only_in_off_path() -> None:
    """Each turn_only run took the opd cell's config (``config.submitted.yaml``, the cell's
    ``context`` teacher) and changed one field on the command line."""
    for seed in SEEDS:
        run = ROOT / "turn-only-pilot" / f"seed-{seed}"
        submitted = LabRunConfig.from_yaml(run / "config.submitted.yaml")
        ran = LabRunConfig.from_yaml(run / "config.original.yaml")
        assert submitted.lab.oracle_teacher.off_path == "context"
        assert ran.lab.oracle_teacher.off_path == "turn_only"
        assert ran.with_overrides(["models.oracle_teacher.off_path=context"]) == submitted
        command = json.loads((run / "command.json").read_text(encoding="utf-8"))
        assert command["overrides"] == ["models.oracle_teacher.off_path=turn_only"]
        assert submitted.run.mode == "opd" and submitted.loss.divergence == "forward_kl"
        assert submitted.train.cycles == 400 and submitted.train.lr == 0.001
        assert submitted.run.seed == _cell(seed, "opd")["run_seed"] == seed


@pytest.mark.parametrize("run", ["context-pilot", "test-context", "test-context-matched"])
def test_the_fixed_oracle_does_not_resume_a_withdrawn_context_run(run: str, tmp_path: Path) -> None:
    """The ``context`` runs were scored by the oracle with the withdrawn stop targets (EOS and
    closing tags where its continuation was undefined). The fixed oracle is another teacher:
    rerunning the run's command over a copy of its cells is refused, never a silent reuse of
    cells the old teacher produced."""
    copy = tmp_path / run
    copy.mkdir()
    shutil.copy2(ROOT / run / "plan.json", copy / "plan.json")
    recipe = ROOT.parents[1] / "recipes" / "toy_calc_chain_oracle.yaml"
    args = ["benchmark", str(recipe), "--arms", "offline_kd,opd", "--seeds", "1"]
    args += ["--output", str(copy), "--quiet", "models.oracle_teacher.off_path=context"]
    if run != "context-pilot":
        args += ["eval.split=test", "eval.max_tasks=1200"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "already holds a benchmark of another base config" in result.output


def test_the_log_names_every_seed() -> None:
    assert f"seeds {SEEDS[0]}–{SEEDS[-1]}" in LOG


TEST_RUN = ROOT / "test-turn-only"
TEST_TASKS = 1200


def test_the_pre_registered_test_split_run_is_frozen_and_its_cells_intact() -> None:
    """The test-split run of the positive control: its protocol frozen before any cell ran
    (bytes and SHA-256), all 24 cells under one plan and unedited, every cold start the
    weights its cell names."""
    from miniverl.utils.hashing import sha256_bytes, sha256_file

    frozen = json.loads((TEST_RUN / "protocol.json").read_text(encoding="utf-8"))
    assert sha256_bytes((TEST_RUN / frozen["stored_as"]).read_bytes()) == frozen["sha256"]
    content = frozen["content"]
    assert content["seeds"] == list(range(1, 9)) and content["arms"] == ["offline_kd", "opd"]
    assert content["endpoints"] == ["all", "k=2"]
    assert content["primary_contrasts"] == [["opd", "offline_kd"]]
    plan = json.loads((TEST_RUN / "plan.json").read_text(encoding="utf-8"))["plan_digest"]
    cells = sorted((TEST_RUN / "cells").glob("*.json"))
    assert len(cells) == 3 * len(content["seeds"])
    for path in cells:
        record = json.loads(path.read_text(encoding="utf-8"))
        assert record["plan_digest"] == plan, path.name
        assert _digest(record["payload"]) == record["payload_sha256"], path.name
        payload = record["payload"]
        assert payload["seed"] in content["seeds"]
        if path.name.endswith("-cold-start.json"):
            weights = TEST_RUN / f"seed-{payload['seed']}" / "cold-start" / "student.safetensors"
            assert sha256_file(weights) == payload["student_sha256"]


def _k2(endpoints: dict[str, Any]) -> str:
    return f"{round(endpoints['success_by_k']['2'] * 200)}/200"


def _run_lines(bench: dict[str, Any]) -> list[str]:
    """The LOG's per-seed rows and contrast lines of the test-split run, from ``benchmark.json``."""
    rows = {(r["seed"], r["arm"]): r for r in bench["rows"]}
    lines = []
    for cold in sorted(bench["cold_starts"], key=lambda c: c["seed"]):
        seed, start = cold["seed"], cold["start_endpoints"]
        cells = [f"{round(start['success'] * TEST_TASKS)}/{TEST_TASKS}, {_k2(start)}"]
        for arm in ("offline_kd", "opd"):
            r = rows[(seed, arm)]
            e = r["endpoints"]
            cells.append(
                f"{r['final_solved']}/{TEST_TASKS}, {_k2(e)}; {e['recovery_rate']:.3f}; "
                f"{e['result_copy_accuracy']:.3f}"
            )
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return lines + [_contrast_line(c) for c in bench["contrasts"]]


def _contrast_line(c: dict[str, Any]) -> str:
    """One contrast of ``benchmark.json`` as the LOG and the docs quote it."""
    low, high = c["interval"]
    holm = f", Holm p = {c['p_holm']:.3f}" if c["p_holm"] is not None else ""
    return (
        f"`{c['arm']}` − `{c['reference']}`, {c['endpoint']}"
        f"{' (primary)' if c['primary'] else ''}: {100 * c['mean_difference']:+.1f} pp, "
        f"95% t-interval [{100 * low:+.1f}, {100 * high:+.1f}] over {len(c['seeds'])} seed "
        f"means, p = {c['p_value']:.3f}{holm}; MDE {100 * c['mde']:.1f} pp"
    )


def test_rerunning_the_test_split_run_reuses_every_cell_and_gives_the_logged_figures(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "test-turn-only"
    shutil.copytree(TEST_RUN, copy)
    recipe = ROOT.parents[1] / "recipes" / "toy_calc_chain_oracle.yaml"
    args = ["benchmark", str(recipe), "--arms", "offline_kd,opd", "--seeds", "1,2,3,4,5,6,7,8"]
    args += ["--output", str(copy), "--protocol", str(copy / "protocol.yaml"), "--quiet"]
    args += ["models.oracle_teacher.off_path=turn_only", "eval.split=test", "eval.max_tasks=1200"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "24 of 24 cells were stored and reused" in result.output
    bench = json.loads((copy / "benchmark.json").read_text(encoding="utf-8"))
    family = [c for c in bench["contrasts"] if c["primary"]]
    assert [c["endpoint"] for c in family] == ["all", "k=2"]
    assert all(c["holm_family"] and c["p_holm"] is not None for c in family)
    for line in _run_lines(bench):
        assert line in LOG, line
    k2 = {(r["seed"], r["arm"]): r["endpoints"]["success_by_k"]["2"] for r in bench["rows"]}
    cold = {c["seed"]: c["start_endpoints"]["success_by_k"]["2"] for c in bench["cold_starts"]}

    def seeds(keep: Any) -> str:
        return ", ".join(str(s) for s in sorted(cold) if keep(s))

    assert f"0/200 at k = 2 on seeds {seeds(lambda s: k2[(s, 'opd')] == 0)}\n" in LOG
    assert f"at k = 2 on seeds {seeds(lambda s: k2[(s, 'opd')] < cold[s])}, while" in LOG
    assert f"cold start's k = 2 on seeds {seeds(lambda s: k2[(s, 'offline_kd')] > cold[s])}." in LOG
    rows = {(r["seed"], r["arm"]): r["endpoints"] for r in bench["rows"]}
    assert max(e["recovery_rate"] for e in rows.values()) <= 0.005  # "at most 0.005"
    assert all(
        rows[(s, "opd")]["result_copy_accuracy"] < rows[(s, "offline_kd")]["result_copy_accuracy"]
        for s in cold
    )  # "below `offline_kd`'s on every seed"
    docs = ROOT.parents[1] / "docs" / "benchmark.md"
    flat = {docs: " ".join(docs.read_text(encoding="utf-8").split())}
    for line in _run_lines(bench)[len(cold) :]:
        assert line in flat[docs], line
    solved = {(r["seed"], r["arm"]): r["final_solved"] for r in bench["rows"]}
    lower_all = sum(solved[(s, "opd")] < solved[(s, "offline_kd")] for s in cold)
    lower_k2 = sum(k2[(s, "opd")] < k2[(s, "offline_kd")] for s in cold)
    everywhere = "all 8" if lower_all == len(cold) else f"{lower_all} of {len(cold)}"
    claim = f"on {everywhere} seeds over all k and on {lower_k2} of {len(cold)} at k = 2"
    assert claim in flat[docs], claim
    zero = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight"]
    at_zero = sum(k2[(s, "opd")] == 0 for s in cold)
    assert f"ends at 0/200 on {zero[at_zero]} seeds" in flat[docs]
    assert "at most 0.005 in every cell" in flat[docs]


def test_the_turn_only_ablation_table_is_the_stored_output() -> None:
    import re

    text = (ROOT / "turn-only-pilot" / "target_ablation.txt").read_text(encoding="utf-8")
    pattern = re.compile(
        r"\s*(\w+): (\d+)/8 episodes fitted, (?:loss ([\d.]+) -> ([\d.]+) nats/token|no position kept); "
        r"greedy eval solved (\d+) -> (\d+) of 60"
    )
    lines = text.splitlines()
    assert len(lines) == 6
    for line in lines:
        match = pattern.match(line)
        assert match is not None, line
        name, episodes, first, last, before, after = match.groups()
        loss = f"{first} → {last}" if first else "no position kept"
        row = f"| `{name}` | {episodes}/8 | {loss} | {before} → {after} |"
        assert row in LOG, row
    assert "{'on_path': 272, 'early_answer': 4, 'later': 54}" in lines[0]
    assert "330 positions of the batch (272 on the oracle's path, 4 at the start" in LOG


FIRST_ERRORS = (
    ("operand_copy", "wrong operator or right operand (operand copy)"),
    ("result_copy", "wrong left operand at step 2 or later (result copy)"),
    ("malformed", "malformed or refused call"),
    ("early_answer", "final answer before the last step"),
    ("answer_copy", "wrong final answer after every step"),
    ("no_answer", "no final answer"),
)


def _stored_cell(run: Path, seed: int, arm: str) -> dict[str, Any]:
    """The payload of one stored test-split cell, its SHA-256 checked."""
    record = json.loads((run / "cells" / f"s{seed}-a0-{arm}.json").read_text("utf-8"))
    assert _digest(record["payload"]) == record["payload_sha256"]
    return record["payload"]


def _first_error_sums(run: Path, arm: str, seeds: list[int]) -> dict[str, int]:
    """Each first-error kind of ``arm`` summed over ``seeds``."""
    kinds = [_stored_cell(run, s, arm)["endpoints"]["first_error_kinds"] for s in seeds]
    return {kind: sum(k[kind] for k in kinds) for kind, _ in FIRST_ERRORS}


def _first_error_lines(run: Path, arms: tuple[str, ...], seeds: list[int]) -> list[str]:
    """The LOG's first-error table of a test-split run: each kind summed over the seeds, per arm,
    then the episodes with an error and the seeds on which each arm beyond the first had more
    malformed first errors than the first arm."""
    cells = {(s, a): _stored_cell(run, s, a)["endpoints"] for s in seeds for a in arms}
    sums = [_first_error_sums(run, a, seeds) for a in arms]
    lines = [
        f"| {label} | " + " | ".join(str(arm_sums[kind]) for arm_sums in sums) + " |"
        for kind, label in FIRST_ERRORS
    ]
    erred = [
        sum(round(cells[(s, a)]["error_rate"] * cells[(s, a)]["episodes"]) for s in seeds)
        for a in arms
    ]
    assert erred == [sum(arm_sums.values()) for arm_sums in sums]
    lines.append("| episodes with an error | " + " | ".join(str(v) for v in erred) + " |")
    for arm in arms[1:]:
        more = [
            s
            for s in seeds
            if cells[(s, arm)]["first_error_kinds"]["malformed"]
            > cells[(s, arms[0])]["first_error_kinds"]["malformed"]
        ]
        lines.append(
            f"`{arm}` more malformed first errors than `{arms[0]}` on {len(more)} of {len(seeds)} seeds"
        )
    return lines


def test_the_first_error_table_of_the_turn_only_run_recomputes() -> None:
    seeds = list(range(1, 9))
    lines = _first_error_lines(TEST_RUN, ("offline_kd", "opd"), seeds)
    for line in lines:
        assert line in LOG, line
    kd, opd = (_first_error_sums(TEST_RUN, arm, seeds) for arm in ("offline_kd", "opd"))
    d = {k: opd[k] - kd[k] for k in kd}
    flat = " ".join(LOG.split())
    claim = (
        f"OPD's {sum(d.values())} extra erring episodes are malformed calls ({d['malformed']:+d}) "
        f"and wrong result copies ({d['result_copy']:+d}), while early answers "
        f"({d['early_answer']:+d}) and wrong final answers ({d['answer_copy']:+d}) fall."
    ).replace("-", "−")
    assert claim in flat, claim
    assert (
        d["no_answer"] == 0 == opd["no_answer"]
        and abs(d["operand_copy"]) < 0.01 * kd["operand_copy"]
    )  # "the same in both arms"
    more = lines[-1].split(" on ")[-1]
    docs = ROOT.parents[1] / "docs" / "benchmark.md"
    assert f"malformed calls (more on {more})" in " ".join(docs.read_text("utf-8").split())


CONTEXT_RUN = ROOT / "test-context"
CONTEXT_ARMS = ("offline_kd", "opd", "offline_kd_reverse_kl", "opd_reverse_kl", "gkd_mix")


def _rerun_context(run: Path, arms: tuple[str, ...], tmp_path: Path, *extra: str) -> dict[str, Any]:
    """The benchmark of a context-teacher test run over its stored cells, as the code that ran it
    (the withdrawn oracle, commit f33fc3e~1) rewrote it with every cell reused:
    ``benchmark-as-run.json`` (results/positive_control/LOG.md, 2026-12-06). The fixed code cannot
    resume these runs (:func:`test_the_fixed_oracle_does_not_resume_a_withdrawn_context_run`);
    their statistics are recomputed from the stored cells by
    ``tests/integration/test_stats_reference.py``."""
    del tmp_path, extra
    bench = json.loads((run / "benchmark-as-run.json").read_text(encoding="utf-8"))
    assert {r["arm"] for r in bench["rows"]} == set(arms)
    assert len(bench["rows"]) == 8 * len(arms)
    return bench


def _context_bench(tmp_path: Path) -> dict[str, Any]:
    """``benchmark.json`` of a rerun of the context run over a copy of its stored cells."""
    return _rerun_context(CONTEXT_RUN, CONTEXT_ARMS, tmp_path)


def _context_lines(bench: dict[str, Any]) -> list[str]:
    """The LOG's per-seed rows, per-arm summary rows and contrast lines of the context run."""
    rows = {(r["seed"], r["arm"]): r for r in bench["rows"]}
    seeds = sorted(c["seed"] for c in bench["cold_starts"])
    lines = []
    for cold in sorted(bench["cold_starts"], key=lambda c: c["seed"]):
        seed, start = cold["seed"], cold["start_endpoints"]
        cells = [f"{round(start['success'] * TEST_TASKS)}, {_k2(start)}"]
        for arm in CONTEXT_ARMS:
            r = rows[(seed, arm)]
            cells.append(f"{r['final_solved']}, {_k2(r['endpoints'])}")
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    for arm in CONTEXT_ARMS:
        cells = [rows[(s, arm)] for s in seeds]
        e = [c["endpoints"] for c in cells]
        b = [c["budget"] for c in cells]
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        lines.append(
            f"| `{arm}` | {100 * mean([x['success'] for x in e]):.1f}% | "
            f"{100 * mean([x['success_by_k']['2'] for x in e]):.1f}% | "
            f"{max(x['recovery_rate'] for x in e):.3f} | "
            f"{mean([x['result_copy_accuracy'] for x in e]):.3f} | "
            f"{mean([x['cpu_seconds'] for x in b]):.0f} | "
            f"{mean([x['student_generated_tokens'] for x in b]):,.0f} | "
            f"{mean([x['teacher_scored_tokens'] for x in b]):,.0f} |"
        )
    return lines + [_contrast_line(c) for c in bench["contrasts"]]


def _unterminated(run: Path) -> dict[str, tuple[int, dict[int, int]]]:
    """Per eval tag: episodes with a turn that opens a ``<tool_call>`` block and never closes it,
    and the index of the first such turn -> episodes."""
    from miniverl.models.tokenizers import ToyTokenizer

    tokenizer = ToyTokenizer()
    out = {}
    for tag, trajectories in _eval_trajectories(run).items():
        turns_at: dict[int, int] = {}
        for trajectory in trajectories:
            text = tokenizer.decode(trajectory.token_ids)
            for index, turn in enumerate(text.split("<|im_start|>assistant\n")[1:]):
                body = turn.split("<|im_end|>")[0]
                if body.startswith("<tool_call>") and "</tool_call>" not in body:
                    turns_at[index] = turns_at.get(index, 0) + 1
                    break
        out[tag] = (sum(turns_at.values()), dict(sorted(turns_at.items())))
    return out


def test_the_unterminated_call_table_recomputes_from_the_pilot_trajectories() -> None:
    counted = {s: _unterminated(ROOT / "turn-only-pilot" / f"seed-{s}") for s in SEEDS}
    finals = [counted[s]["final"][0] for s in SEEDS]
    total = sum(finals)
    malformed_first = sum(_turn_only(s)[1]["first_error_kinds"]["malformed"] for s in SEEDS)
    claim = (
        f"(in at least {total - malformed_first} of the {total} episodes: only "
        f"{malformed_first} of the five runs' episodes have a malformed call as their first error)"
    )
    assert claim in " ".join(LOG.split()), claim
    for seed in SEEDS:
        (before, _), (after, turns) = counted[seed]["baseline"], counted[seed]["final"]
        where = ", ".join(f"{k}: {v}" for k, v in turns.items())
        row = f"| {seed} | {before}/{TASKS} | {after}/{TASKS} | {where} |"
        assert row in LOG, row
        assert before == 0 and min(turns, default=2) >= 2  # "No cold start"; "index 2 or more"
    docs = " ".join((ROOT.parents[1] / "docs" / "benchmark.md").read_text("utf-8").split())
    claim = f"in {min(finals)} to {max(finals)} of {TASKS} validation episodes per seed"
    assert claim in docs, claim


def test_the_context_run_is_frozen_and_its_cells_intact() -> None:
    """Its protocol frozen before any cell ran (bytes and SHA-256), all 48 cells under one plan
    and unedited, every cold start the weights its cell names; byte-identical to the turn_only
    run's cold start of the same seed where both ran on this CPU type (the LOG's list)."""
    from miniverl.utils.hashing import sha256_bytes, sha256_file

    frozen = json.loads((CONTEXT_RUN / "protocol.json").read_text(encoding="utf-8"))
    assert sha256_bytes((CONTEXT_RUN / frozen["stored_as"]).read_bytes()) == frozen["sha256"]
    content = frozen["content"]
    assert content["seeds"] == list(range(1, 9)) and content["arms"] == list(CONTEXT_ARMS)
    assert content["endpoints"] == ["all", "k=2"]
    assert content["primary_contrasts"] == [
        ["opd", "offline_kd"],
        ["opd_reverse_kl", "offline_kd_reverse_kl"],
    ]
    plan = json.loads((CONTEXT_RUN / "plan.json").read_text(encoding="utf-8"))["plan_digest"]
    cells = sorted((CONTEXT_RUN / "cells").glob("*.json"))
    assert len(cells) == (1 + len(CONTEXT_ARMS)) * len(content["seeds"])
    for path in cells:
        record = json.loads(path.read_text(encoding="utf-8"))
        assert record["plan_digest"] == plan, path.name
        assert _digest(record["payload"]) == record["payload_sha256"], path.name
        payload = record["payload"]
        if path.name.endswith("-cold-start.json"):
            seed = payload["seed"]
            weights = CONTEXT_RUN / f"seed-{seed}" / "cold-start" / "student.safetensors"
            assert sha256_file(weights) == payload["student_sha256"]
            other = TEST_RUN / f"seed-{seed}" / "cold-start" / "student.safetensors"
            same = sha256_file(other) == payload["student_sha256"]
            assert same == (seed in (1, 2, 3, 5, 6, 7)), seed
    assert "The cold starts of seeds 1, 2, 3, 5, 6 and 7 are byte-identical" in " ".join(
        LOG.split()
    )


def test_rerunning_the_context_run_reuses_every_cell_and_gives_the_logged_figures(
    tmp_path: Path,
) -> None:
    bench = _context_bench(tmp_path)
    family = [c for c in bench["contrasts"] if c["primary"]]
    assert [(c["arm"], c["endpoint"]) for c in family] == [
        ("opd", "all"),
        ("opd", "k=2"),
        ("opd_reverse_kl", "all"),
        ("opd_reverse_kl", "k=2"),
    ]
    assert all(c["holm_family"] and c["p_holm"] < 0.05 for c in family)  # "All four ... reject"
    for line in _context_lines(bench):
        assert line in LOG, line
    for line in _first_error_lines(CONTEXT_RUN, CONTEXT_ARMS, list(range(1, 9))):
        assert line in LOG, line
    rows = {(r["seed"], r["arm"]): r for r in bench["rows"]}
    seeds = range(1, 9)
    assert all(rows[(s, "opd")]["final_solved"] == 0 for s in seeds)  # "0 of 1,200 ... every seed"
    assert all(rows[(s, "opd_reverse_kl")]["endpoints"]["success_by_k"]["2"] == 0 for s in seeds)
    assert max(r["endpoints"]["recovery_rate"] for r in rows.values()) <= 0.006
    cpu = {k: r["budget"]["cpu_seconds"] for k, r in rows.items()}
    for arm in ("offline_kd", "offline_kd_reverse_kl", "gkd_mix"):
        assert all(cpu[(s, arm)] < cpu[(s, "opd")] for s in seeds), arm  # "less ... every seed"
    more = sum(cpu[(s, "opd_reverse_kl")] > cpu[(s, "opd")] for s in seeds)
    assert f"`opd_reverse_kl` more on {more} of 8;" in " ".join(LOG.split())
    opd_errors = _first_error_sums(CONTEXT_RUN, "opd", list(seeds))
    assert opd_errors["early_answer"] == 0 and sum(opd_errors.values()) == 9600
    flat = {
        path.name: " ".join(path.read_text(encoding="utf-8").split())
        for path in (ROOT.parents[1] / "docs" / "benchmark.md",)
    }
    for line in _context_lines(bench)[-16:]:
        assert line in flat["benchmark.md"], line
    fewer = all(
        rows[(s, "opd_reverse_kl")]["final_solved"]
        < rows[(s, "offline_kd_reverse_kl")]["final_solved"]
        for s in seeds
    )
    gkd_lower = sum(rows[(s, "gkd_mix")]["final_solved"] for s in seeds) < sum(
        rows[(s, "offline_kd")]["final_solved"] for s in seeds
    )
    assert fewer and gkd_lower
    lowest = sorted(rows[(s, "opd_reverse_kl")]["final_solved"] for s in seeds)[:2]
    claim = f"on every seed (on two seeds {lowest[1]} and {lowest[0]} of 1,200)"
    assert all(claim in text for text in (*flat.values(), " ".join(LOG.split()))), claim
    turn_only = [_stored_cell(TEST_RUN, s, a) for s in seeds for a in ("offline_kd", "opd")]
    worst = max(
        [r["endpoints"]["recovery_rate"] for r in rows.values()]
        + [c["endpoints"]["recovery_rate"] for c in turn_only]
    )
    assert worst < 0.01 and "No cell's recovery rate exceeds 0.006" in flat["benchmark.md"]
    assert "`opd` solves no test task on any seed" in flat["benchmark.md"]


MATCHED_RUN = ROOT / "test-context-matched"
MATCHED_ARMS = ("opd", "offline_kd_reverse_kl", "opd_reverse_kl")
MATCHED_ON = "teacher_scored_tokens"


def _matched_bench(tmp_path: Path) -> dict[str, Any]:
    """``benchmark.json`` of a rerun of the compute-matched addendum over a copy of its cells."""
    return _rerun_context(MATCHED_RUN, MATCHED_ARMS, tmp_path, "--compute-matched", MATCHED_ON)


def _matched_lines(bench: dict[str, Any]) -> list[str]:
    """The LOG's per-seed rows of the compute-matched addendum, then its contrast lines."""
    rows = {(r["seed"], r["arm"]): r for r in bench["rows"]}
    lines = []
    for seed in sorted({r["seed"] for r in bench["rows"]}):
        opd, capped = rows[(seed, "opd")], rows[(seed, "opd_reverse_kl")]
        step = _stored_cell(CONTEXT_RUN, seed, "opd_reverse_kl")
        cap = capped["compute_cap"]
        lines.append(
            f"| {seed} | {opd['budget'][MATCHED_ON]:,} | {cap['measured']:,} | "
            f"{capped['budget']['optimizer_steps']} | {step['final_solved']}, {_k2(step['endpoints'])} | "
            f"{capped['final_solved']}, {_k2(capped['endpoints'])} | "
            f"{rows[(seed, 'offline_kd_reverse_kl')]['final_solved']} |"
        )
    return lines + [_contrast_line(c) for c in bench["contrasts"]]


def test_the_compute_matched_run_reuses_the_step_matched_cold_starts_and_opd_cells() -> None:
    """Frozen before its first cell; cold starts and opd cells byte for byte test-context's;
    every other cell capped at its seed's opd spend; the unbound offline cap changed nothing."""
    from miniverl.utils.hashing import sha256_bytes

    frozen = json.loads((MATCHED_RUN / "protocol.json").read_text(encoding="utf-8"))
    assert sha256_bytes((MATCHED_RUN / frozen["stored_as"]).read_bytes()) == frozen["sha256"]
    content = frozen["content"]
    assert content["seeds"] == list(range(1, 9)) and content["arms"] == list(MATCHED_ARMS)
    assert content["primary_contrasts"] == [["opd_reverse_kl", "offline_kd_reverse_kl"]]
    plan = json.loads((MATCHED_RUN / "plan.json").read_text(encoding="utf-8"))["plan_digest"]
    step_plan = json.loads((CONTEXT_RUN / "plan.json").read_text(encoding="utf-8"))
    assert plan == step_plan["plan_digest"]
    cells = sorted((MATCHED_RUN / "cells").glob("*.json"))
    assert len(cells) == 8 * (1 + len(MATCHED_ARMS))
    for path in cells:
        record = json.loads(path.read_text(encoding="utf-8"))
        assert (
            record["plan_digest"] == plan and _digest(record["payload"]) == record["payload_sha256"]
        )
        if path.name.endswith(("-cold-start.json", "-opd.json")):
            assert path.read_bytes() == (CONTEXT_RUN / "cells" / path.name).read_bytes(), path.name
    for seed in range(1, 9):
        opd = _stored_cell(MATCHED_RUN, seed, "opd")
        for arm in ("offline_kd_reverse_kl", "opd_reverse_kl"):
            cap = _stored_cell(MATCHED_RUN, seed, arm)["compute_cap"]
            assert cap["resource"] == MATCHED_ON and cap["enforced"]
            assert cap["limit"] == opd["budget"][MATCHED_ON]
        offline = _stored_cell(MATCHED_RUN, seed, "offline_kd_reverse_kl")
        step = _stored_cell(CONTEXT_RUN, seed, "offline_kd_reverse_kl")
        assert not offline["compute_cap"]["bound"]
        assert offline["tasks"] == step["tasks"] and offline["endpoints"] == step["endpoints"]


def test_rerunning_the_compute_matched_run_gives_the_logged_figures(tmp_path: Path) -> None:
    bench = _matched_bench(tmp_path)
    family = [c for c in bench["contrasts"] if c["primary"]]
    assert [(c["arm"], c["endpoint"]) for c in family] == [
        ("opd_reverse_kl", "all"),
        ("opd_reverse_kl", "k=2"),
    ]
    for line in _matched_lines(bench):
        assert line in LOG, line
    docs = " ".join((ROOT.parents[1] / "docs" / "benchmark.md").read_text(encoding="utf-8").split())
    for line in _matched_lines(bench)[8:12]:
        assert line in docs, line
    rows = {(r["seed"], r["arm"]): r["final_solved"] for r in bench["rows"]}
    fewer = all(
        rows[(s, "opd_reverse_kl")]
        <= _stored_cell(CONTEXT_RUN, s, "opd_reverse_kl")["final_solved"]
        for s in range(1, 9)
    )
    assert fewer and "fewer test tasks than at 400 steps on every seed" in " ".join(LOG.split())
