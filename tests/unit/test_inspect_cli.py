"""``miniverl inspect``: summary, counts by origin, --limit, --trajectory, --spans, --json,
and failing loudly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import oracle_trajectories, record_of, write_records
from miniverl.cli import common
from miniverl.cli import main as cli
from miniverl.inspection.summary import (
    plural,
    provenance_check,
    summarize_file,
    wrap_span_text,
)
from miniverl.schemas.trajectory import Trajectory
from miniverl.trajectory.io import write_trajectories


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables are not folded at CliRunner's default 80 columns."""
    monkeypatch.setattr(common.console, "_width", 250)
    monkeypatch.setattr(common.err_console, "_width", 250)


@pytest.fixture(scope="module")
def trajectories() -> list[Trajectory]:
    return oracle_trajectories(3, difficulty="hard")


@pytest.fixture
def traj_file(tmp_path: Path, trajectories: list[Trajectory]) -> Path:
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(path, trajectories)
    return path


def _invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli.app, list(args))


def test_summary(traj_file: Path, trajectories: list[Trajectory]) -> None:
    result = _invoke("inspect", str(traj_file))
    assert result.exit_code == 0, result.output
    tokens = sum(t.length for t in trajectories)
    model = sum(sum(t.model_generated_mask) for t in trajectories)
    assert f"3 trajectories | {tokens} tokens | {model} model tokens" in result.stdout
    assert result.stdout.splitlines()[0] == (
        "  3 oracle traces: solved 3 (100.0%) | answered wrong 0 | ended without an answer 0"
    )
    assert "graded 3 (gave a final answer) | solved 3 (100.0% of graded)" in result.stdout
    assert "termination {'final_answer': 3}" in result.stdout
    assert "tools {'calculator': 6}" in result.stdout
    assert "no (context)" in result.stdout and "assistant_tool_call" in result.stdout
    assert "first 3 trajectories" in result.stdout
    for t in trajectories:
        assert t.trajectory_id in result.stdout


def test_limit(traj_file: Path, trajectories: list[Trajectory]) -> None:
    result = _invoke("inspect", str(traj_file), "--limit", "1")
    assert result.exit_code == 0
    assert "first 1 trajectory\n" in result.stdout or "first 1 trajectory " in result.stdout
    assert "1 trajectories" not in result.stdout
    assert trajectories[0].trajectory_id in result.stdout
    assert trajectories[2].trajectory_id not in result.stdout
    zero = _invoke("inspect", str(traj_file), "--limit", "0")
    assert zero.exit_code == 0 and "first " not in zero.stdout
    assert "3 trajectories" in zero.stdout
    assert _invoke("inspect", str(traj_file), "--limit", "-1").exit_code == 2


def test_trajectory_and_spans(traj_file: Path, trajectories: list[Trajectory]) -> None:
    target = trajectories[1]
    result = _invoke("inspect", str(traj_file), "--trajectory", target.trajectory_id, "--spans")
    assert result.exit_code == 0, result.output
    assert f"  1 trajectory | {target.length} tokens" in result.stdout
    assert "1 trajectories" not in result.stdout and "1 oracle trace:" in result.stdout
    assert f"spans of {target.trajectory_id}" in result.stdout
    for span in target.spans:
        assert f"[{span.start}, {span.end})" in result.stdout
    assert "<|im_start|>system" in result.stdout


def test_spans_need_trajectory(traj_file: Path) -> None:
    result = _invoke("inspect", str(traj_file), "--spans")
    assert result.exit_code == 2
    assert "--spans needs --trajectory ID" in result.stderr


def test_unknown_trajectory(traj_file: Path) -> None:
    result = _invoke("inspect", str(traj_file), "--trajectory", "nope")
    assert result.exit_code == 1
    assert f"trajectory 'nope' not found in {traj_file}" in result.stderr


def test_json(traj_file: Path, trajectories: list[Trajectory]) -> None:
    result = _invoke("inspect", str(traj_file), "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["trajectories"] == 3
    assert data["tokens"] == sum(t.length for t in trajectories)
    assert data["model_tokens"] == sum(sum(t.model_generated_mask) for t in trajectories)
    assert data["critical_tokens"] == sum(sum(t.critical_mask) for t in trajectories)
    assert (data["graded"], data["solved"], data["solve_rate"]) == (3, 3, 1.0)
    assert data["termination"] == {"final_answer": 3}
    assert data["failure_categories"] == {"solved": 3}
    assert data["tokenizer_fingerprints"] == [trajectories[0].tokenizer_fingerprint]
    assert data["policy_versions"] == [0]
    assert sum(data["tokens_by_span_type"].values()) == data["tokens"]
    assert [r["trajectory_id"] for r in data["trajectory_rows"]] == [
        t.trajectory_id for t in trajectories
    ]
    assert data["spans"] is None
    assert data["provenance_check"] == {
        "trainable_span_types": ["assistant_final", "assistant_text", "assistant_tool_call"],
        "critical_span_types": ["assistant_final", "assistant_tool_call"],
        "context_span_types_excluded_from_loss": ["system", "tool_result", "user"],
    }
    assert data["provenance_check"] == provenance_check()


def test_json_with_spans(traj_file: Path, trajectories: list[Trajectory]) -> None:
    target = trajectories[0]
    result = _invoke(
        "inspect", str(traj_file), "--trajectory", target.trajectory_id, "--spans", "--json"
    )
    data = json.loads(result.stdout)
    assert [
        (s["span_type"], s["start"], s["end"], s["tokens"], s["in_loss"]) for s in data["spans"]
    ] == [(s.span_type.value, s.start, s.end, s.length, s.is_model_generated) for s in target.spans]
    assert data["spans"][0]["text"] == target.spans[0].text[:400]


@pytest.mark.parametrize("where", [0, 2])
def test_tampered_record_fails_with_path_and_line(
    tmp_path: Path, trajectories: list[Trajectory], where: int
) -> None:
    records = [record_of(t) for t in trajectories]
    records[where]["model_generated_mask"][2] = True  # a system token claims to be model-generated
    path = write_records(tmp_path / "t.jsonl", records)
    for args in ([], ["--json"], ["--trajectory", trajectories[1].trajectory_id]):
        result = _invoke("inspect", str(path), *args)
        assert result.exit_code == 1
        assert (
            f"{path}:{where + 1}: Value error, model_generated_mask disagrees with the span partition"
            in result.stderr
        )
        assert result.stdout == ""


def test_missing_file(tmp_path: Path) -> None:
    result = _invoke("inspect", str(tmp_path / "none.jsonl"))
    assert result.exit_code == 1
    assert f"trajectory file not found: {tmp_path / 'none.jsonl'}" in result.stderr
    assert "run 'miniverl demo' or 'miniverl train <recipe>' first" in result.stderr


def test_summarize_file_counts_failures_and_tools(tmp_path: Path) -> None:
    from helpers import calculator_tasks, final_text, make_runner, tool_call_text

    task = calculator_tasks(1)[0]
    wrong = make_runner([tool_call_text("1 +"), final_text("7")]).rollout(
        task, seed=1, policy_version=2
    )
    unparsed = make_runner(["nothing"]).rollout(task, seed=2, policy_version=1)
    path = tmp_path / "t.jsonl"
    write_trajectories(path, [wrong, unparsed])
    summary = summarize_file(path, limit=1)
    assert (summary.trajectories, summary.graded, summary.solved) == (2, 1, 0)
    assert summary.failure_categories == {"wrong_answer": 1}
    assert summary.tools == {"calculator": 1}  # the unparsed turn is not counted as a tool
    assert summary.policy_versions == [1, 2]
    assert summary.termination == {"final_answer": 1, "parse_error_limit": 1}
    assert len(summary.rows) == 1 and summary.rows[0].source == "policy"
    assert summary.rows[0].solved is False


@pytest.fixture
def half_unanswered(tmp_path: Path) -> Path:
    """Two solved oracle traces and two policy episodes that never parsed a tool call."""
    from helpers import calculator_tasks, make_runner

    task = calculator_tasks(1)[0]
    unparsed = [make_runner(["nothing"]).rollout(task, seed=s, policy_version=1) for s in (1, 2)]
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(path, [*oracle_trajectories(2), *unparsed])
    return path


def test_header_counts_episodes_that_ended_without_an_answer(half_unanswered: Path) -> None:
    """Half the episodes unanswered is 50% success, not the 100% of graded ones; and the
    unanswered half is the student's, which a rate over the whole file would hide."""
    result = _invoke("inspect", str(half_unanswered))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:5] == [
        "  4 trajectories, counted by origin below: 2 student rollouts, 2 oracle traces",
        "  2 student rollouts: solved 0 (0.0%) | answered wrong 0 | "
        "ended without an answer 2 (parse_error_limit 2)",
        "    graded 0 (none gave a final answer)",
        "  2 oracle traces: solved 2 (100.0%) | answered wrong 0 | ended without an answer 0",
        "    graded 2 (gave a final answer) | solved 2 (100.0% of graded)",
    ]
    data = json.loads(_invoke("inspect", str(half_unanswered), "--json").stdout)
    assert data["outcome"] == {
        "trajectories": 4,
        "solved": 2,
        "answered_wrong": 0,
        "without_answer": 2,
        "without_answer_by_reason": {"parse_error_limit": 2},
        "success_rate": 0.5,
        "solve_rate_of_graded": 1.0,
    }
    assert data["success_rate"] == 0.5 and data["solve_rate"] == 1.0
    by_origin = data["outcome_by_origin"]
    assert set(by_origin) == {"student", "oracle"}
    assert by_origin["student"]["without_answer_by_reason"] == {"parse_error_limit": 2}
    assert (by_origin["student"]["success_rate"], by_origin["oracle"]["success_rate"]) == (0, 1)


@pytest.fixture
def every_origin(tmp_path: Path) -> Path:
    """One trajectory of each origin a run writes, as its writers label them."""
    from helpers import calculator_tasks, final_text, make_runner, tool_call_text

    task = calculator_tasks(1)[0]
    script = [tool_call_text("1 + 1"), final_text("2")]

    def sampled(tid: str, **extra: object) -> Trajectory:
        runner = make_runner(script)
        return runner.rollout(task, seed=1, trajectory_id=tid, extra_metadata=dict(extra))

    oracle = oracle_trajectories(1)[0]
    corrective = oracle.model_copy(
        update={"trajectory_id": "c", "metadata": {**oracle.metadata, "source": "corrective"}}
    )
    trajectories = [
        sampled("student", cycle=0),
        sampled("teacher", teacher_sampled=True, cycle=0),
        sampled("pool", offline_kd_pool=True),
        oracle,
        corrective,
        sampled("eval-final", eval_tag="final"),
        oracle.model_copy(update={"trajectory_id": "bare", "metadata": {}}),
    ]
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(path, trajectories)
    return path


def test_every_origin_is_counted_apart(every_origin: Path) -> None:
    """Student rollouts, teacher samples, oracle traces and evaluation episodes each get
    their own count and outcome; a trajectory that records no source says so."""
    data = json.loads(_invoke("inspect", str(every_origin), "--json").stdout)
    counts = {k: v["trajectories"] for k, v in data["outcome_by_origin"].items()}
    assert counts == {"student": 1, "teacher": 2, "oracle": 2, "eval": 1, "unknown": 1}
    assert [r["origin"] for r in data["trajectory_rows"]] == [
        "student",
        "teacher",
        "teacher",
        "oracle",
        "oracle",
    ]
    result = _invoke("inspect", str(every_origin), "--limit", "0")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        "  7 trajectories, counted by origin below: 1 student rollout, 2 teacher samples, "
        "2 oracle traces, 1 evaluation episode, 1 trajectory of unrecorded origin"
    )
    for line in (
        "  1 student rollout: solved ",
        "  2 teacher samples: solved ",
        "  2 oracle traces: solved 2 (100.0%)",
        "  1 evaluation episode: solved ",
        "  1 trajectory of unrecorded origin: solved 1 (100.0%)",
    ):
        assert line in result.stdout, line


@pytest.mark.parametrize("count", [0, 1, 2])
def test_plural_agrees_with_the_count(count: int) -> None:
    noun = "trajectory" if count == 1 else "trajectories"
    assert plural(count, "trajectory", "trajectories") == f"{count} {noun}"
    assert plural(count, "token") == f"{count} token" + ("" if count == 1 else "s")


def _pieces(text: str) -> list[str]:
    """Chat markers, tags and words of ``text``, with ``\\n`` (as printed) for each newline."""
    out: list[str] = []
    for i, line in enumerate(text.split("\n")):
        if i:
            out.append("\\n")
        out += re.findall(r"<\|[^|]*\|>|</?[a-z_]+>|[^\s<]+|<", line)
    return out


@pytest.mark.parametrize("width", [20, 40, 80])
def test_span_text_wraps_between_tokens_never_inside_a_word(
    monkeypatch: pytest.MonkeyPatch, traj_file: Path, trajectories: list[Trajectory], width: int
) -> None:
    """Each span's printed lines hold its text in order, and every line ends where a chat
    marker, a tag or a word ends: none is cut across two lines."""
    monkeypatch.setattr(common.console, "_width", width)
    target = trajectories[0]
    result = _invoke("inspect", str(traj_file), "--trajectory", target.trajectory_id, "--spans")
    assert result.exit_code == 0, result.output
    printed = result.stdout.split(f"spans of {target.trajectory_id}", 1)[1].splitlines()[1:]
    wrapped = False
    for span in target.spans:
        header = next(i for i, line in enumerate(printed) if f"[{span.start}, {span.end})" in line)
        body = []
        for line in printed[header + 1 :]:
            if not line.startswith(" " * cli.SPAN_TEXT_INDENT):
                break
            body.append("".join(line.split()))
        pieces = _pieces(span.text)
        assert "".join(body) == "".join(pieces), (width, span.span_type)
        ends = {sum(len(p) for p in pieces[: i + 1]) for i in range(len(pieces))}
        cuts = {sum(len(line) for line in body[: i + 1]) for i in range(len(body))}
        assert cuts <= ends, (width, span.span_type, body)
        wrapped |= len(body) > span.text.count("\n") + 1
    assert wrapped or width == 80, "the narrow consoles must wrap some line"


def test_wrap_span_text_breaks_only_between_pieces() -> None:
    text = '<|im_start|>user\nCompute 51 * 29.<|im_end|>\n<tool_call>{"a": 1}</tool_call>'
    assert wrap_span_text(text, 12) == [
        "<|im_start|>",
        "user\\n",
        "Compute 51 *",
        "29.",
        "<|im_end|>\\n",
        "<tool_call>",
        '{"a": 1}',
        "</tool_call>",
    ]
    assert wrap_span_text("supercalifragilistic word", 5) == ["supercalifragilistic", "word"]
    assert wrap_span_text(text, 200) == [
        "<|im_start|>user\\n",
        "Compute 51 * 29.<|im_end|>\\n",
        '<tool_call>{"a": 1}</tool_call>',
    ]


@pytest.mark.parametrize("width", [40, 80, 250])
def test_trajectory_ids_are_printed_whole_at_any_width(
    monkeypatch: pytest.MonkeyPatch, half_unanswered: Path, width: int
) -> None:
    """Every id printed can be pasted into ``--trajectory``: never cut with an ellipsis or
    folded across lines."""
    monkeypatch.setattr(common.console, "_width", width)
    ids = [json.loads(line)["trajectory_id"] for line in half_unanswered.read_text().splitlines()]
    for args in ([], ["--wide"]):
        result = _invoke("inspect", str(half_unanswered), *args)
        assert result.exit_code == 0, result.output
        assert "…" not in result.stdout
        for tid in ids:
            assert tid in result.stdout, (width, args, result.stdout)
            pasted = _invoke("inspect", str(half_unanswered), "--trajectory", tid, "--json")
            assert json.loads(pasted.stdout)["trajectories"] == 1
