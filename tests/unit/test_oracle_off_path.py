"""The oracle teacher's targets are a policy (lab/teachers/oracle.py, ``lab.oracle_teacher.off_path``).

Property tests over random deviations of oracle traces (a character inserted, deleted or
replaced inside a call or an answer, a block of the wrong kind, a stray tag, an early answer,
a miscopied operand): at every student-generated position the teacher either has no target
(the position leaves the selection) or a target that is **never EOS** and is **derivable from
the transcript**: every number the teacher writes, finishing the student's digits or not, is a
whole number of the task text or of a tool result the student has seen. ``turn_only`` targets
are pinned to the values the code gave before this rule existed (they were never affected).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import final_text, make_runner, tool_call_text, toy_tokenizer
from miniverl.config.models import RolloutConfig, RunConfig
from miniverl.environments.base import Task
from miniverl.environments.calc_chain import generate_tasks
from miniverl.environments.registry import make_environment
from miniverl.errors import BackendError
from miniverl.lab.teachers.oracle import OracleTeacher, deviated_continuation
from miniverl.schemas.text import ASSISTANT_HEADER, IM_END, IM_START
from miniverl.schemas.trajectory import Trajectory
from miniverl.training.sources import make_select_and_align

ROOT = Path(__file__).resolve().parents[2]
CONFIG = RolloutConfig(
    max_turns=9, max_new_tokens_per_turn=60, max_total_tokens=1200, max_parse_errors=3
)
TURN_ONLY_TARGETS_SHA256 = "b7cac0d75577f95492a69b74fd446a0fdfe4d1707a0b1ff03915ff6e8a052749"
"""sha256 of the ``turn_only`` teacher's kept positions and targets over :func:`_episodes`,
computed by the code in which the EOS fallback still existed (commit a918966)."""
_NUMBER = re.compile(r"-?\d+")
_RESULT = re.compile(r"<\|im_start\|>user\n<tool_result>\n(.*?)\n</tool_result>", re.S)
_CHARS = [
    *'0123456789+-* "{}:,\nabcxyz',
    "<tool_call>",
    "</tool_call>",
    "<final>",
    "</final>",
]


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return generate_tasks("train", 40, 3, (3,))


def _teacher(
    tasks: list[Task], off_path: str = "context", env: str = "calc_chain"
) -> OracleTeacher:
    return OracleTeacher(
        toy_tokenizer(), make_environment(env), tasks, smoothing=0.01, off_path=off_path
    )


def _model_targets(traj: Trajectory) -> list[int]:
    return [j for s in traj.spans if s.is_model_generated for j in range(s.start, s.end)]


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


def _derivable(context: str) -> set[str]:
    """Whole numbers of the task text (the first user message) and of every tool observation."""
    prompt = context.split(f"{IM_START}user\n", 1)[1].split(IM_END, 1)[0]
    shown = [prompt]
    for body in _RESULT.findall(context):
        payload = json.loads(body)
        shown.append(str(payload.get("result") or payload.get("error") or ""))
    return {n for text in shown for n in _NUMBER.findall(text)}


def _violations(teacher: OracleTeacher, traj: Trajectory) -> list[str]:
    """Every violation at the model positions of ``traj``: an EOS target, or a number the
    teacher would write (finishing the student's digits or not) that the transcript before
    the turn does not hold."""
    tok = teacher.tokenizer
    ids = traj.token_ids
    positions = [j - 1 for j in _model_targets(traj)]
    targets = teacher.next_token_ids(ids, positions)
    states = teacher.turn_states(ids, positions)
    text = tok.decode(ids)
    out = []
    for p, target, (generated, action) in zip(positions, targets, states, strict=True):
        if target is None:
            continue
        if target == tok.eos_token_id:
            out.append(f"EOS targeted at position {p}")
            continue
        if teacher.off_path == "context":
            rest = deviated_continuation(generated, action)
        else:
            rest = action[len(generated) :]
        assert rest and tok.encode(rest)[0] == target
        upto = len(tok.decode(ids[: p + 1]))
        before = text[: text.rfind(ASSISTANT_HEADER, 0, upto)]
        typed = re.search(r"-?\d*$", generated).group()
        written = [m.group() for m in _NUMBER.finditer(typed + rest) if m.end() > len(typed)]
        missing = [n for n in written if n not in _derivable(before)]
        if missing:
            out.append(f"underivable {missing} at position {p}")
    return out


def _deviate(text: str, edits: list[tuple[int, int, int]]) -> str:
    """Apply (kind, where, char) edits: 0 insert, 1 replace, 2 delete."""
    chars = list(text)
    for kind, where, char in edits:
        at = where % (len(chars) + 1)
        piece = _CHARS[char % len(_CHARS)]
        if kind == 0:
            chars.insert(at, piece)
        elif kind == 1 and at < len(chars):
            chars[at] = piece
        elif kind == 2 and at < len(chars):
            del chars[at]
    return "".join(chars)


def _deviated_episode(
    task: Task, turn: int, edits: list[tuple[int, int, int]], early: bool
) -> Trajectory:
    e = task.data["expressions"]
    script = [tool_call_text(x) for x in e] + [final_text(task.answer)]
    if early:
        script.insert(turn % len(script), final_text(task.data["results"][0].__str__()))
    turn %= len(script)
    script[turn] = _deviate(script[turn], edits)
    script += [tool_call_text(x) for x in e] + [final_text(task.answer)]
    runner = make_runner(script, environment=make_environment("calc_chain"), config=CONFIG)
    return runner.rollout(task, seed=0)


EDITS = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 200), st.integers(0, len(_CHARS) - 1)),
    min_size=1,
    max_size=3,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    index=st.integers(0, 39),
    turn=st.integers(0, 5),
    edits=EDITS,
    early=st.booleans(),
    off_path=st.sampled_from(["context", "turn_only"]),
)
def test_no_target_is_eos_and_every_target_is_derivable(
    tasks: list[Task], index: int, turn: int, edits: list, early: bool, off_path: str
) -> None:
    task = tasks[index]
    traj = _deviated_episode(task, turn, edits, early)
    teacher = _teacher(tasks, off_path)
    assert _violations(teacher, traj) == []


def test_the_scripted_deviations_hold_no_eos_or_underivable_target(tasks: list[Task]) -> None:
    """Every way of leaving the path the rule distinguishes, on six tasks, both modes."""
    for off_path in ("context", "turn_only"):
        teacher = _teacher(tasks, off_path)
        for traj in _episodes(tasks):
            assert _violations(teacher, traj) == []


def test_undefined_continuations_carry_no_target() -> None:
    call, answer = tool_call_text("12 + 34"), final_text("46")
    at = call.index("12")
    assert deviated_continuation("<final>\n4", call) is None  # an answer where a call is due
    assert deviated_continuation("<tool_call>", answer) is None  # a call where the answer is due
    assert deviated_continuation(call[:at] + "19", call) is None  # a miscopied number
    assert deviated_continuation(call[:at] + "7", call) is None
    assert deviated_continuation(call, call) is None  # the action used up
    assert deviated_continuation(call[:-1] + "<tool_call>", call) is None
    assert deviated_continuation(call[:at] + "1", call) == call[at + 1 :]  # still on the path
    assert deviated_continuation(call[:at] + "19 ", call) == call[at + 3 :]  # number ended


def test_context_targets_are_a_superset_of_turn_only_and_drop_only_undefined_positions(
    tasks: list[Task],
) -> None:
    context, turn_only = _teacher(tasks, "context"), _teacher(tasks, "turn_only")
    dropped = 0
    for traj in _episodes(tasks):
        targets = _model_targets(traj)
        keep_c = context.target_mask(traj.token_ids, targets)
        keep_t = turn_only.target_mask(traj.token_ids, targets)
        assert all(c or not t for c, t in zip(keep_c, keep_t, strict=True))
        ids_c = context.next_token_ids(traj.token_ids, [j - 1 for j in targets])
        assert [i is not None for i in ids_c] == keep_c
        dropped += keep_c.count(False)
    assert dropped > 20  # the wrong-kind blocks and miscopied numbers of the scripts


def test_turn_only_targets_are_unchanged(tasks: list[Task]) -> None:
    teacher = _teacher(tasks, "turn_only")
    digest = hashlib.sha256()
    for traj in _episodes(tasks):
        targets = _model_targets(traj)
        kept = [
            j
            for j, k in zip(targets, teacher.target_mask(traj.token_ids, targets), strict=True)
            if k
        ]
        ids = teacher.next_token_ids(traj.token_ids, [j - 1 for j in kept])
        digest.update(json.dumps([kept, ids]).encode())
    assert digest.hexdigest() == TURN_ONLY_TARGETS_SHA256


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


def test_an_answer_opened_where_a_call_is_due_carries_no_target_after_the_tag(
    tasks: list[Task],
) -> None:
    task = tasks[0]
    tok = toy_tokenizer()
    traj = make_runner(
        [final_text("5")], environment=make_environment("calc_chain"), config=CONFIG
    ).rollout(task, seed=0)
    targets = _model_targets(traj)
    teacher = _teacher(tasks, "context")
    first = tok.encode(tool_call_text(task.data["expressions"][0]))[0]
    predicted = teacher.next_token_ids(traj.token_ids, [j - 1 for j in targets])
    assert predicted[0] == first  # the turn start: the due call
    assert predicted[1:] == [None] * (len(targets) - 1)


def test_an_unknown_off_path_is_refused(tasks: list[Task]) -> None:
    with pytest.raises(BackendError, match="unknown oracle teacher off_path") as info:
        _teacher(tasks, "privileged")
    assert "context, turn_only" in (info.value.hint or "")
