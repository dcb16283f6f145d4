"""``models.oracle_teacher.off_path`` (teachers/oracle.py): privileged, context, turn_only.

Checked on scripted calc_chain episodes that leave the oracle's path in every way the
continuation rule distinguishes (a miscopied operand, an answer where a call is due, a call
where the answer is due, a wrong digit inside a number, an early answer with no call). For
``context`` every number the teacher writes must be derivable from the transcript (the task
text or a tool result); ``privileged`` must stay what it was (a pinned digest of its targets,
and the same config digest); ``turn_only`` must mask exactly the positions after the first
deviation inside a turn, and the selection must drop exactly those.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from helpers import final_text, make_runner, tool_call_text, toy_tokenizer
from miniverl.config.models import RolloutConfig, RunConfig
from miniverl.environments.base import Task
from miniverl.environments.calc_chain import generate_tasks
from miniverl.environments.registry import make_environment
from miniverl.errors import BackendError
from miniverl.schemas.text import ASSISTANT_HEADER, FINAL_CLOSE, IM_START, TOOL_CALL_CLOSE
from miniverl.schemas.trajectory import Trajectory
from miniverl.teachers.oracle import OracleTeacher
from miniverl.training.sources import make_select_and_align

ROOT = Path(__file__).resolve().parents[2]
CONFIG = RolloutConfig(
    max_turns=9, max_new_tokens_per_turn=40, max_total_tokens=900, max_parse_errors=3
)
PRIVILEGED_TARGETS_SHA256 = "db27b862f1f4ee77125e27cdc369274d6584470e85e84b1bae00164234d7641d"
"""sha256 of the privileged teacher's targets at every model position of :func:`_episodes`,
computed by the code before ``off_path`` existed (commit a42e94f)."""
RECIPE_DIGEST = "46e475505afe"
"""``recipes/toy_calc_chain_oracle.yaml``'s config digest (prefix) before ``off_path`` existed."""
_NUMBER = re.compile(r"\d+")
_RESULT = re.compile(r"<\|im_start\|>user\n<tool_result>\n(.*?)\n</tool_result>", re.S)


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return generate_tasks("train", 40, 3, (3,))


def _scripts(task: Task) -> list[list[str]]:
    e, r = task.data["expressions"], task.data["results"]
    op, y = task.data["steps"][1]
    symbol = {"add": "+", "subtract": "-", "multiply": "*"}[op]
    miscopy = tool_call_text(f"{r[0] + 10} {symbol} {y}")
    final = final_text(task.answer)
    return [
        [tool_call_text(e[0]), miscopy, tool_call_text(e[1]), tool_call_text(e[2]), final],
        [final_text("5")],
        [tool_call_text(e[0]), final_text(str(r[0]))],
        [tool_call_text(x) for x in (e[0], e[1], e[2], e[0])] + [final_text("1")],
        [tool_call_text("7" + e[0][1:]), final_text("3" + task.answer)],
    ]


def _episodes(tasks: list[Task]) -> list[Trajectory]:
    out = []
    for task in tasks[:6]:
        for script in _scripts(task):
            runner = make_runner(script, environment=make_environment("calc_chain"), config=CONFIG)
            out.append(runner.rollout(task, seed=0))
    return out


def _teacher(tasks: list[Task], off_path: str) -> OracleTeacher:
    return OracleTeacher(
        toy_tokenizer(), make_environment("calc_chain"), tasks, smoothing=0.01, off_path=off_path
    )


def _model_targets(traj: Trajectory) -> list[int]:
    return [j for s in traj.spans if s.is_model_generated for j in range(s.start, s.end)]


def _derivable(context: str) -> set[str]:
    """Numbers of the task text (the first user message) and of the genuine tool results."""
    prompt = context.split(f"{IM_START}user\n", 1)[1].split("<|im_end|>", 1)[0]
    shown = [prompt] + [json.loads(body).get("result") or "" for body in _RESULT.findall(context)]
    return {n for text in shown for n in _NUMBER.findall(text)}


def _underivable_numbers(teacher: OracleTeacher, traj: Trajectory, p: int) -> list[str]:
    """Continue greedily from ``x[..p]`` to the end of the block; numbers the teacher wrote
    digits of (alone or finishing the student's) that the transcript does not determine."""
    tok = teacher.tokenizer
    ids = list(traj.token_ids[: p + 1])
    text = tok.decode(ids)
    header = text.rfind(ASSISTANT_HEADER)
    typed = len(text) - header - len(ASSISTANT_HEADER)
    for _ in range(80):
        nxt = teacher.next_token_ids(ids, [len(ids) - 1])[0]
        if nxt == tok.eos_token_id:
            break
        ids.append(nxt)
        turn = tok.decode(ids)[header + len(ASSISTANT_HEADER) :]
        if turn[typed:].endswith((TOOL_CALL_CLOSE, FINAL_CLOSE)):
            break
    turn = tok.decode(ids)[header + len(ASSISTANT_HEADER) :]
    allowed = _derivable(text[:header])
    return [
        m.group() for m in _NUMBER.finditer(turn) if m.end() > typed and m.group() not in allowed
    ]


def _violations(teacher: OracleTeacher, episodes: list[Trajectory]) -> list[str]:
    out = []
    for traj in episodes:
        for j in _model_targets(traj)[::5]:
            out += _underivable_numbers(teacher, traj, j - 1)
    return out


def test_privileged_is_todays_teacher_bit_for_bit(tasks: list[Task]) -> None:
    teacher = _teacher(tasks, "privileged")
    digest = hashlib.sha256()
    for traj in _episodes(tasks):
        positions = [j - 1 for j in _model_targets(traj)]
        digest.update(json.dumps(teacher.next_token_ids(traj.token_ids, positions)).encode())
    assert digest.hexdigest() == PRIVILEGED_TARGETS_SHA256
    config = RunConfig.from_yaml(ROOT / "recipes" / "toy_calc_chain_oracle.yaml")
    assert config.models.oracle_teacher.off_path == "privileged"
    assert config.digest().startswith(RECIPE_DIGEST)
    assert "off_path" not in teacher.capabilities.extra


def test_every_context_target_is_derivable_from_the_transcript(tasks: list[Task]) -> None:
    """The same scan finds the privileged teacher's unrealisable numbers (the true final value
    before any tool result shows it, a template's digits finishing a miscopied number)."""
    episodes = _episodes(tasks)
    assert _violations(_teacher(tasks, "context"), episodes) == []
    assert _violations(_teacher(tasks, "turn_only"), episodes) == []
    assert len(_violations(_teacher(tasks, "privileged"), episodes)) > 10


def test_context_closes_an_early_answer_and_still_asks_for_the_next_call(
    tasks: list[Task],
) -> None:
    task = tasks[0]
    tok = toy_tokenizer()
    traj = make_runner(
        [final_text("5")], environment=make_environment("calc_chain"), config=CONFIG
    ).rollout(task, seed=0)
    start = _model_targets(traj)[0]
    inside = next(
        j for j in _model_targets(traj) if tok.decode(traj.token_ids[start:j]).endswith("\n")
    )
    context, privileged = _teacher(tasks, "context"), _teacher(tasks, "privileged")
    first = tok.encode(tool_call_text(task.data["expressions"][0]))[0]
    assert context.next_token_ids(traj.token_ids, [start - 1]) == [first]
    assert tok.decode(context.next_token_ids(traj.token_ids, [inside - 1])) == FINAL_CLOSE
    assert tok.decode(privileged.next_token_ids(traj.token_ids, [inside - 1])) == task.answer[0]


def test_turn_only_masks_exactly_the_positions_after_a_deviation_inside_a_turn(
    tasks: list[Task],
) -> None:
    task = tasks[0]
    tok = toy_tokenizer()
    script = _scripts(task)[0]
    traj = make_runner(script, environment=make_environment("calc_chain"), config=CONFIG).rollout(
        task, seed=0
    )
    targets = _model_targets(traj)
    turn1 = next(s for s in traj.spans if s.is_model_generated and s.turn_id == 1)
    recall = tok.encode(tool_call_text(task.data["expressions"][1]))
    written = traj.token_ids[turn1.start : turn1.end]
    first_wrong = next(i for i, (a, b) in enumerate(zip(written, recall, strict=False)) if a != b)
    expected = [not (turn1.start + first_wrong < j < turn1.end) for j in targets]
    assert expected.count(False) == turn1.end - turn1.start - first_wrong - 1 > 5
    assert _teacher(tasks, "turn_only").target_mask(traj.token_ids, targets) == expected
    for mode in ("privileged", "context"):
        assert _teacher(tasks, mode).target_mask(traj.token_ids, targets) == [True] * len(targets)

    config = RunConfig.from_yaml(
        ROOT / "recipes" / "toy_calc_chain_oracle.yaml",
        ["models.oracle_teacher.off_path=turn_only", "selection.selector=all_model_tokens"],
    )
    teacher = _teacher(tasks, "turn_only")
    full, _ = make_select_and_align(config, None)(traj, 0)
    masked, _ = make_select_and_align(config, None, teacher.target_mask)(traj, 0)
    keep = teacher.target_mask(traj.token_ids, full.selection.positions)
    kept = [j for j, k in zip(full.selection.positions, keep, strict=True) if k]
    assert masked.selection.positions == kept and len(kept) < len(full.selection.positions)
    assert len(masked.selection.weights) == len(kept)
    assert masked.alignment.digest() != full.alignment.digest()


def test_an_unknown_off_path_is_refused(tasks: list[Task]) -> None:
    with pytest.raises(BackendError, match="unknown oracle teacher off_path") as info:
        _teacher(tasks, "oracle")
    assert "privileged, context, turn_only" in (info.value.hint or "")
