"""The teacher gate: is the teacher competent at the states the *student* visits?

On-policy distillation asks the teacher for targets at the student's own states, which leave
the oracle's path (a miscopied number, a broken call). A teacher that is perfect on oracle
traces but lost after an error gives the student wrong targets exactly where on-policy
training is supposed to help, and a benchmark of OPD against off-policy arms would then
measure the teacher, not the method. So before any arm runs, the benchmark measures:

    gate = (actions whose correct next action the teacher reproduces) / (actions scored)

over every assistant turn of student rollouts on validation tasks. Precisely, for turn ``t`` of
a student episode:

- the *state* is the transcript before the turn: the token ids up to the start of the turn's
  first model-generated span (it ends with the assistant header the policy continues from);
- the *correct next action* is the oracle's from that state
  (:func:`~miniverl.environments.oracle_state.next_oracle_action`: the next oracle call not yet
  done, which after an error is the corrective re-call, or the final answer), rendered exactly
  as oracle traces render it (``format_tool_call`` / ``format_final``);
- the teacher *reproduces* it when, teacher-forced on ``state + action``, its argmax at every
  action position is that action's token (so greedy decoding from the state emits the action
  verbatim, up to its closing tag, where decoding stops).

A state is *off path* when some earlier turn did not advance the oracle (``steps_done <
t``); the result reports accuracy on those separately, and on oracle-trace states for
comparison. The benchmark calls :func:`evaluate_teacher_gate`, stores the result with
:func:`record_teacher_gate` and refuses to start with :func:`require_teacher_gate`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.agent.protocol import format_final, format_tool_call
from miniverl.config.models import RolloutConfig
from miniverl.environments.base import Task, ToolEnvironment
from miniverl.environments.oracle_state import next_oracle_action, oracle_tool_results
from miniverl.errors import TeacherGateError, ToolEnvironmentError
from miniverl.lab.config import lab_of
from miniverl.schemas.trajectory import Trajectory
from miniverl.utils.io import read_json, write_json
from miniverl.utils.seeding import derive_seed

DEFAULT_THRESHOLD = 0.95
"""Default minimum gate value (``lab.teacher_gate.threshold``)."""
TEACHER_GATE_FILE = "teacher-gate.json"
"""Where :func:`record_teacher_gate` stores the result inside a run (or cold-start) directory."""
SCHEMA = "miniverl.teacher_gate/1"


@dataclass(frozen=True)
class GateState:
    """One scored state: a prefix the student reached and the action the oracle takes there."""

    task_id: str
    turn: int
    steps_done: int
    off_path: bool
    prefix: list[int] = field(repr=False)
    action_text: str = ""


@dataclass(frozen=True)
class TeacherGateResult:
    """The gate value and its breakdown; ``value`` is the number the threshold applies to."""

    value: float
    actions: int
    correct: int
    token_accuracy: float
    off_path_actions: int
    off_path_correct: int
    oracle_state_actions: int
    oracle_state_correct: int
    episodes: int
    student_solved: int
    temperature: float
    per_action: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def off_path_accuracy(self) -> float | None:
        return self.off_path_correct / self.off_path_actions if self.off_path_actions else None

    @property
    def oracle_state_accuracy(self) -> float | None:
        if not self.oracle_state_actions:
            return None
        return self.oracle_state_correct / self.oracle_state_actions

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            **asdict(self),
            "off_path_accuracy": self.off_path_accuracy,
            "oracle_state_accuracy": self.oracle_state_accuracy,
        }


def action_text(
    environment: ToolEnvironment, task: Task, turns: Sequence[Any], expected: Sequence[str]
) -> tuple[str, int]:
    """The rendered correct next action after ``turns`` and the oracle steps already done."""
    action = next_oracle_action(environment, task, turns, expected_results=expected)
    text = (
        format_final(action.answer or "") if action.call is None else format_tool_call(action.call)
    )
    return text, action.steps_done


def gate_states(
    environment: ToolEnvironment, tasks_by_id: dict[str, Task], trajectories: Sequence[Trajectory]
) -> list[GateState]:
    """Every assistant-turn state of ``trajectories`` with its correct next action."""
    states: list[GateState] = []
    expected_cache: dict[str, list[str]] = {}
    for traj in trajectories:
        task = tasks_by_id[traj.task_id]
        if task.task_id not in expected_cache:
            expected_cache[task.task_id] = oracle_tool_results(environment, task)
        expected = expected_cache[task.task_id]
        starts: dict[int, int] = {}
        for span in traj.spans:
            if span.is_model_generated and span.turn_id not in starts:
                starts[span.turn_id] = span.start
        for turn, start in sorted(starts.items()):
            before = [t for t in traj.turns if t.turn_id < turn]
            text, done = action_text(environment, task, before, expected)
            states.append(
                GateState(
                    task_id=task.task_id,
                    turn=turn,
                    steps_done=done,
                    off_path=done != len(before),
                    prefix=list(traj.token_ids[:start]),
                    action_text=text,
                )
            )
    return states


def teacher_reproduces(
    teacher: Any, states: Sequence[GateState], *, batch_rows: int = 16
) -> list[tuple[bool, int, int]]:
    """Per state ``(all action tokens are argmax, argmax-correct tokens, action tokens)``.

    ``teacher`` is any backend with ``tokenizer``, ``device``, ``hidden_states_at_batch`` and
    ``project``; rows are scored ``batch_rows`` at a time without gradients.
    """
    import torch

    from miniverl.models.batching import build_padded_trajectory_batch

    tokenizer = teacher.tokenizer
    rows: list[tuple[list[int], list[int]]] = []
    for state in states:
        action = tokenizer.encode(state.action_text)
        ids = state.prefix + action
        rows.append((ids, list(range(len(state.prefix), len(ids)))))
    out: list[tuple[bool, int, int]] = []
    with torch.no_grad():
        for begin in range(0, len(rows), batch_rows):
            chunk = rows[begin : begin + batch_rows]
            batch = build_padded_trajectory_batch(
                [ids for ids, _ in chunk],
                [[j - 1 for j in targets] for _, targets in chunk],
                tokenizer.pad_token_id,
                teacher.device,
            )
            predicted = (
                teacher.project(teacher.hidden_states_at_batch(batch)).argmax(dim=-1).tolist()
            )
            cursor = 0
            for ids, targets in chunk:
                hits = [predicted[cursor + i] == ids[j] for i, j in enumerate(targets)]
                cursor += len(targets)
                out.append((all(hits), sum(hits), len(targets)))
    return out


def score_teacher_gate(
    teacher: Any,
    environment: ToolEnvironment,
    tasks: Sequence[Task],
    student_trajectories: Sequence[Trajectory],
    oracle_trajectories: Sequence[Trajectory] = (),
    *,
    temperature: float = 1.0,
    batch_rows: int = 16,
) -> TeacherGateResult:
    """The gate over given student episodes (and, for comparison, oracle episodes)."""
    by_id = {t.task_id: t for t in tasks}
    states = gate_states(environment, by_id, student_trajectories)
    scored = teacher_reproduces(teacher, states, batch_rows=batch_rows)
    oracle_scored = teacher_reproduces(
        teacher, gate_states(environment, by_id, oracle_trajectories), batch_rows=batch_rows
    )
    correct = sum(ok for ok, _, _ in scored)
    tokens = sum(n for _, _, n in scored)
    return TeacherGateResult(
        value=correct / len(scored) if scored else 0.0,
        actions=len(scored),
        correct=correct,
        token_accuracy=sum(k for _, k, _ in scored) / tokens if tokens else 0.0,
        off_path_actions=sum(s.off_path for s in states),
        off_path_correct=sum(
            ok for s, (ok, _, _) in zip(states, scored, strict=True) if s.off_path
        ),
        oracle_state_actions=len(oracle_scored),
        oracle_state_correct=sum(ok for ok, _, _ in oracle_scored),
        episodes=len(student_trajectories),
        student_solved=sum(int(t.solved) for t in student_trajectories),
        temperature=float(temperature),
        per_action=[
            {
                "task_id": s.task_id,
                "turn": s.turn,
                "steps_done": s.steps_done,
                "off_path": s.off_path,
                "action": s.action_text,
                "reproduced": ok,
                "tokens_correct": k,
                "tokens": n,
            }
            for s, (ok, k, n) in zip(states, scored, strict=True)
        ],
    )


def evaluate_teacher_gate(
    teacher: Any,
    student: Any,
    environment: ToolEnvironment,
    tasks: Sequence[Task],
    rollout: RolloutConfig,
    *,
    seed: int,
    temperature: float | None = None,
    batch_size: int | None = None,
) -> TeacherGateResult:
    """Roll the student out on ``tasks`` (validation tasks) and score the teacher at its states.

    ``temperature`` defaults to ``rollout.temperature``: the states a sampling arm's student
    visits. Episode ``i`` uses seed ``derive_seed(seed, "teacher-gate", i)``.
    """
    temp = rollout.temperature if temperature is None else float(temperature)
    students = gate_episodes(
        student, environment, tasks, rollout, seed=seed, temperature=temp, batch_size=batch_size
    )
    runner = RolloutRunner(student, environment, rollout)
    oracles = [runner.oracle_rollout(task) for task in tasks]
    return score_teacher_gate(teacher, environment, tasks, students, oracles, temperature=temp)


def require_teacher_gate(result: TeacherGateResult, threshold: float = DEFAULT_THRESHOLD) -> None:
    """Raise :class:`TeacherGateError` unless ``result.value >= threshold`` over at least one action."""
    if result.actions and result.value >= threshold:
        return
    raise TeacherGateError(
        f"teacher gate failed: the teacher reproduces the correct next action at "
        f"{result.correct} of {result.actions} student-visited states ({result.value:.3f}), "
        f"under the threshold {threshold:.3f}",
        hint="fit the toy teacher longer (lab.toy_fit.max_steps, lab.toy_fit.target_success) "
        "or on more noise-injected traces (lab.toy_fit.noise_fraction, "
        "lab.toy_fit.extra_tasks); lower lab.teacher_gate.threshold only knowingly",
    )


def record_teacher_gate(
    result: TeacherGateResult, threshold: float, directory: str | Path, events: Any = None
) -> Path:
    """Write ``teacher-gate.json`` (value, threshold, passed, breakdown) and emit an event.

    ``events`` is an optional event log with ``emit(name, **fields)`` (a run's ``EventLog``).
    """
    path = Path(directory) / TEACHER_GATE_FILE
    passed = bool(result.actions) and result.value >= threshold
    write_json(path, {**result.to_dict(), "threshold": threshold, "passed": passed})
    if events is not None:
        events.emit(
            "teacher_gate",
            echo=f"teacher top-1 on the correct next action at student states {result.value:.3f} "
            f"({result.correct}/{result.actions}; threshold {threshold:.2f})",
            value=result.value,
            threshold=threshold,
            passed=passed,
            actions=result.actions,
            off_path_actions=result.off_path_actions,
            off_path_accuracy=result.off_path_accuracy,
            oracle_state_accuracy=result.oracle_state_accuracy,
        )
    return path


def _configured_gate(
    teacher: Any,
    student: Any,
    environment: ToolEnvironment,
    eval_split: Sequence[Task],
    config: Any,
    *,
    tasks: int | None = None,
) -> TeacherGateResult:
    """The gate as a run's config defines it: the first ``tasks`` (default
    ``lab.teacher_gate.tasks``) validation tasks, episode seeds from ``run.seed``, rollouts
    batched by ``eval.batch_size`` at ``rollout.temperature``. The benchmark's cold start and
    :func:`gate_of_weight_files` both score through here, so they see the same states."""
    count = lab_of(config).teacher_gate.tasks if tasks is None else tasks
    return evaluate_teacher_gate(
        teacher,
        student,
        environment,
        eval_split[:count],
        config.rollout,
        seed=config.run.seed,
        batch_size=config.eval.batch_size,
    )


def gate_of_weight_files(
    config: Any,
    student_file: str | Path,
    teacher_file: str | Path | None,
    *,
    tasks: int | None = None,
) -> TeacherGateResult:
    """The gate of saved weights under a recipe, without a benchmark cold start.

    Why: fitting a teacher and warming up a student take most of a cold start; this scores
    any saved pair against each other (a teacher from one run, a student from another) so a
    teacher can be checked before a long protocol starts. ``config`` is a ``RunConfig`` whose
    models, environment and rollout settings shape both backends; the weights are
    safetensors files (e.g. ``<run>/toy-teacher.safetensors``, a checkpoint's
    ``adapter.safetensors`` of a full-weight student, a cold start's ``student.safetensors``).
    With ``lab.oracle_teacher`` the teacher has no weights: ``teacher_file`` is None.
    ``tasks`` defaults to ``lab.teacher_gate.tasks``; seeds and temperature are the
    benchmark's (:func:`run_teacher_gate`).
    """
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from miniverl.environments.registry import make_environment
    from miniverl.environments.tasks_file import build_splits
    from miniverl.errors import CheckpointError
    from miniverl.lab.teachers.oracle import build_oracle_teacher
    from miniverl.models.factory import build_student, build_teacher, build_tokenizer
    from miniverl.training.resolve import resolve_device

    tokenizer = build_tokenizer(config)
    device = resolve_device(config, cuda_available=torch.cuda.is_available())
    environment = make_environment(config.environment.name, **config.environment.params)
    splits = build_splits(environment, config.environment)
    backends = {"student": (build_student(config, tokenizer, device), student_file)}
    if lab_of(config).oracle_teacher is not None:
        if teacher_file is not None:
            raise CheckpointError(
                f"lab.oracle_teacher has no weights, but a teacher file was given: {teacher_file}",
                hint="pass no teacher file (benchmarks/teacher_gate_probe.py STUDENT oracle)",
            )
        every_task = [t for split in splits.values() for t in split]
        teacher = build_oracle_teacher(config, tokenizer, every_task, device)
    else:
        if teacher_file is None:
            raise CheckpointError(
                "a teacher weights file is needed unless the config sets lab.oracle_teacher",
                hint="pass the teacher's safetensors file (e.g. <run>/toy-teacher.safetensors)",
            )
        teacher = build_teacher(config, tokenizer, device)
        backends["teacher"] = (teacher, teacher_file)
    for role, (backend, file) in backends.items():
        try:
            backend.load_full_state_dict(load_file(str(file)))
        except (OSError, SafetensorError) as exc:
            raise CheckpointError(
                f"cannot read the {role} weights {file}: {exc}",
                hint=f"pass a safetensors file of the {role}'s full weights",
            ) from None
    return _configured_gate(
        teacher, backends["student"][0], environment, splits["eval"], config, tasks=tasks
    )


STATE_GATE_FILE = "teacher-state-gate.json"
"""Where :func:`record_state_gate` stores the held-out state gate inside a run directory."""
STATE_SCHEMA = "miniverl.teacher_state_gate/1"
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class StateGateResult:
    """The held-out state gate: per-position top-1 agreement and the teacher's recovery.

    Positions are every target position inside the student's assistant turns on held-out
    tasks (:mod:`miniverl.lab.teachers.fitting`, :class:`~miniverl.lab.teachers.fitting.TurnState`).
    *On path*: the student has not deviated yet (no earlier turn failed to advance the
    oracle, and its tokens so far in the turn agree with the oracle's action). *Off path*:
    after a deviation: in a later turn (the label is the corrective action's next token) or
    later in the same turn, where no oracle label exists and only a *privileged* prediction
    is scored, as a miss: a digit that makes a number no earlier text of the transcript
    holds (e.g. the final value when no tool result shows it). ``unlabelled_positions``
    counts the positions after an in-turn deviation, privileged or not.
    """

    on_path_positions: int
    on_path_correct: int
    off_path_positions: int
    off_path_correct: int
    privileged_predictions: int
    unlabelled_positions: int
    recovery_states: int
    recovered: int
    turns: int
    episodes: int
    student_solved: int
    temperature: float
    tasks: int
    privileged_rule: str = "any_new_number"
    per_turn: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def on_path_agreement(self) -> float | None:
        return self.on_path_correct / self.on_path_positions if self.on_path_positions else None

    @property
    def off_path_agreement(self) -> float | None:
        return self.off_path_correct / self.off_path_positions if self.off_path_positions else None

    @property
    def recovery_rate(self) -> float | None:
        return self.recovered / self.recovery_states if self.recovery_states else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": STATE_SCHEMA,
            **asdict(self),
            "on_path_agreement": self.on_path_agreement,
            "off_path_agreement": self.off_path_agreement,
            "recovery_rate": self.recovery_rate,
        }


def privileged_prediction(
    context: str, turn_so_far: str, predicted: str, rule: str = "any_new_number"
) -> bool:
    """Whether ``predicted`` writes a number the transcript does not determine.

    ``context`` is the transcript before the turn (prompt, tool results, earlier turns),
    ``turn_so_far`` the turn's text before the prediction. Every digit run that
    ``predicted`` touches must be a number of ``context`` (a prefix of one, while the run
    is still open at the end of the text); a run that is not is privileged information.
    ``rule`` (``lab.teacher_gate.privileged``): ``"teacher_departs"`` judges a run only
    where its digits before the prediction were still a prefix of a number of ``context``
    (or there were none): a digit carrying on a number the student already wrote wrong
    departs from nothing, and no continuation of it is right.
    """
    known = set(_DIGITS.findall(context))
    text = turn_so_far + predicted
    for match in _DIGITS.finditer(text):
        if match.end() <= len(turn_so_far):
            continue
        before = text[match.start() : len(turn_so_far)]
        if rule == "teacher_departs" and before and not any(k.startswith(before) for k in known):
            continue
        number = match.group()
        if match.end() == len(text):
            if not any(k.startswith(number) for k in known):
                return True
        elif number not in known:
            return True
    return False


def _argmax_rows(
    teacher: Any, rows: Sequence[tuple[list[int], list[int]]], batch_rows: int
) -> list[list[int]]:
    """Per row, the teacher's top-1 id predicting each target position (from ``j - 1``)."""
    import torch

    from miniverl.models.batching import build_padded_trajectory_batch

    out: list[list[int]] = []
    with torch.no_grad():
        for begin in range(0, len(rows), batch_rows):
            chunk = [r for r in rows[begin : begin + batch_rows]]
            live = [r for r in chunk if r[1]]
            predicted: list[int] = []
            if live:
                batch = build_padded_trajectory_batch(
                    [ids for ids, _ in live],
                    [[j - 1 for j in targets] for _, targets in live],
                    teacher.tokenizer.pad_token_id,
                    teacher.device,
                )
                predicted = (
                    teacher.project(teacher.hidden_states_at_batch(batch)).argmax(dim=-1).tolist()
                )
            cursor = 0
            for _, targets in chunk:
                out.append(predicted[cursor : cursor + len(targets)])
                cursor += len(targets)
    return out


class _ContinuePolicy:
    """Replays a student's first turns token for token, then lets ``teacher`` generate."""

    def __init__(self, turns: Sequence[list[int]], teacher: Any) -> None:
        self.turns, self.teacher = [list(t) for t in turns], teacher
        self.tokenizer = teacher.tokenizer
        self.capabilities = getattr(teacher, "capabilities", None)

    def generate(self, prompt_ids: list[int], *, max_new_tokens: int, **kwargs: Any) -> Any:
        from miniverl.models.base import GenerationResult

        if not self.turns:
            return self.teacher.generate(prompt_ids, max_new_tokens=max_new_tokens, **kwargs)
        ids = self.turns.pop(0)[:max_new_tokens]
        return GenerationResult(
            token_ids=ids,
            text=self.tokenizer.decode(ids),
            finish_reason="stop_sequence",
            num_prompt_tokens=len(prompt_ids),
        )


def first_off_path_turns(
    environment: ToolEnvironment,
    tasks_by_id: Mapping[str, Task],
    student_trajectories: Sequence[Trajectory],
    tokenizer: Any,
) -> dict[str, int]:
    """``trajectory_id -> turn`` of each episode's first off-path state: the first turn
    played after a turn that did not advance the oracle (episodes without one are absent)."""
    from miniverl.lab.teachers.dagger import label_student_states

    return _first_off(
        _Tagged(traj.trajectory_id, state)
        for traj in student_trajectories
        for state in label_student_states(environment, tasks_by_id, [traj], tokenizer)
    )


def _first_off(states: Iterable[_Tagged]) -> dict[str, int]:
    """``trajectory_id -> turn`` of the first off-path state of each episode, in turn order."""
    first_off: dict[str, int] = {}
    for tagged in states:
        if tagged.off_path:
            first_off.setdefault(tagged.trajectory_id, tagged.turn)
    return first_off


def recovery_outcomes(
    teacher: Any,
    environment: ToolEnvironment,
    tasks_by_id: Mapping[str, Task],
    student_trajectories: Sequence[Trajectory],
    first_off: Mapping[str, int],
    rollout: RolloutConfig,
) -> list[dict[str, Any]]:
    """For each student episode with an off-path turn, does ``teacher`` recover from it?

    The episode is replayed up to its first off-path turn (``first_off``, from
    :func:`first_off_path_turns`: the state after a turn that did not advance the oracle,
    that turn's tool answer included), then ``teacher`` -- any policy -- continues greedily;
    ``solved`` is the environment's verdict on the final answer.
    """
    out: list[dict[str, Any]] = []
    for traj in student_trajectories:
        if traj.trajectory_id not in first_off:
            continue
        turn = first_off[traj.trajectory_id]
        cont = continue_from(teacher, environment, tasks_by_id[traj.task_id], traj, turn, rollout)
        out.append({"trajectory_id": traj.trajectory_id, "from_turn": turn, "solved": cont.solved})
    return out


def continue_from(
    policy: Any,
    environment: ToolEnvironment,
    task: Task,
    trajectory: Trajectory,
    turn: int,
    rollout: RolloutConfig,
) -> Trajectory:
    """``trajectory``'s first ``turn`` assistant turns replayed token for token (the tool
    answers regenerated by ``environment``), then ``policy`` playing on greedily: the whole
    episode, its turns from ``turn`` on the policy's."""
    from miniverl.lab.teachers.fitting import turn_spans

    spans = turn_spans(trajectory)
    replay = [list(trajectory.token_ids[a:b]) for t, (a, b) in sorted(spans.items()) if t < turn]
    runner = RolloutRunner(
        _ContinuePolicy(replay, policy),  # type: ignore[arg-type]
        environment,
        rollout,
        tokenizer=policy.tokenizer,
        model_id="teacher-recovery",
    )
    return runner.rollout(
        task, seed=0, temperature=0.0, trajectory_id=f"{trajectory.trajectory_id}:recovery"
    )


def score_state_gate(
    teacher: Any,
    environment: ToolEnvironment,
    tasks: Sequence[Task],
    student_trajectories: Sequence[Trajectory],
    rollout: RolloutConfig,
    *,
    temperature: float = 1.0,
    batch_rows: int = 16,
    recovery: bool = True,
    privileged_rule: str = "any_new_number",
) -> StateGateResult:
    """The held-out state gate of ``teacher`` over given student episodes (see the result;
    ``privileged_rule``: :func:`privileged_prediction`'s ``rule``)."""
    from miniverl.lab.teachers.dagger import label_student_states

    by_id = {t.task_id: t for t in tasks}
    tokenizer = teacher.tokenizer
    states = []
    for traj in student_trajectories:
        for state in label_student_states(environment, by_id, [traj], tokenizer):
            states.append(_Tagged(traj.trajectory_id, state))
    labelled = _argmax_rows(teacher, [t.state.gate_row() for t in states], batch_rows)
    after = _argmax_rows(teacher, [t.state.after_deviation_row() for t in states], batch_rows)
    on_n = on_ok = off_n = off_ok = privileged = unlabelled = 0
    per_turn: list[dict[str, Any]] = []
    for tagged, got, got_after in zip(states, labelled, after, strict=True):
        state = tagged.state
        ids, targets = state.gate_row()
        hits = [p == ids[j] for p, j in zip(got, targets, strict=True)]
        if state.off_path:
            off_n, off_ok = off_n + len(hits), off_ok + sum(hits)
        else:
            on_n, on_ok = on_n + len(hits), on_ok + sum(hits)
        context = tokenizer.decode(state.prefix)
        _, after_targets = state.after_deviation_row()
        leaked = 0
        for p, j in zip(got_after, after_targets, strict=True):
            i = j - len(state.prefix)
            so_far = tokenizer.decode(state.generated[:i])
            leaked += privileged_prediction(context, so_far, tokenizer.decode([p]), privileged_rule)
        privileged += leaked
        unlabelled += len(after_targets)
        off_n += leaked
        per_turn.append(
            {
                "task_id": state.task_id,
                "turn": state.turn,
                "steps_done": state.steps_done,
                "off_path": state.off_path,
                "labelled": len(hits),
                "correct": sum(hits),
                "after_deviation": len(after_targets),
                "privileged": leaked,
            }
        )
    recovered = (
        recovery_outcomes(
            teacher, environment, by_id, student_trajectories, _first_off(states), rollout
        )
        if recovery
        else []
    )
    return StateGateResult(
        on_path_positions=on_n,
        on_path_correct=on_ok,
        off_path_positions=off_n,
        off_path_correct=off_ok,
        privileged_predictions=privileged,
        unlabelled_positions=unlabelled,
        recovery_states=len(recovered),
        recovered=sum(int(r["solved"]) for r in recovered),
        turns=len(states),
        episodes=len(student_trajectories),
        student_solved=sum(int(t.solved) for t in student_trajectories),
        temperature=float(temperature),
        tasks=len(tasks),
        privileged_rule=privileged_rule,
        per_turn=per_turn,
    )


@dataclass(frozen=True)
class _Tagged:
    trajectory_id: str
    state: Any

    @property
    def off_path(self) -> bool:
        return bool(self.state.off_path)

    @property
    def turn(self) -> int:
        return int(self.state.turn)


def require_disjoint(tasks: Sequence[Task], fit_task_ids: Iterable[str]) -> None:
    """Raise :class:`TeacherGateError` when a gate task is one the teacher was fitted on."""
    shared = sorted({t.task_id for t in tasks} & set(fit_task_ids))
    if shared:
        raise TeacherGateError(
            f"the held-out state gate would score {len(shared)} task(s) the teacher was fitted "
            f"on (e.g. {shared[:3]}): its states are not held out",
            hint="gate on the eval split and fit on train (+ lab.toy_fit.extra_tasks, which "
            "exclude every split); never pass a fitting task to the gate",
        )


def gate_episodes(
    student: Any,
    environment: ToolEnvironment,
    tasks: Sequence[Task],
    rollout: RolloutConfig,
    *,
    seed: int,
    temperature: float,
    batch_size: int | None = None,
) -> list[Trajectory]:
    """The student's episodes the gates score: one per task, sampled at ``temperature`` with
    seed ``derive_seed(seed, "teacher-gate", i)``, ids ``<task_id>:gate``."""
    runner = RolloutRunner(student, environment, rollout)
    requests = [
        EpisodeRequest(
            task, derive_seed(seed, "teacher-gate", i), trajectory_id=f"{task.task_id}:gate"
        )
        for i, task in enumerate(tasks)
    ]
    return runner.rollout_batch(requests, batch_size=batch_size, temperature=temperature)


def evaluate_state_gate(
    teacher: Any,
    student: Any,
    environment: ToolEnvironment,
    tasks: Sequence[Task],
    rollout: RolloutConfig,
    *,
    seed: int,
    fit_task_ids: Iterable[str],
    temperature: float | None = None,
    batch_size: int | None = None,
    recovery: bool = True,
    privileged_rule: str = "any_new_number",
) -> StateGateResult:
    """Roll the student out on held-out ``tasks`` and score the teacher at its states.

    Refuses (:func:`require_disjoint`) when a task is among ``fit_task_ids``. The episodes
    are the turn-start gate's (:func:`evaluate_teacher_gate`: seed ``derive_seed(seed,
    "teacher-gate", i)``, ``rollout.temperature`` unless given).
    """
    require_disjoint(tasks, fit_task_ids)
    temp = rollout.temperature if temperature is None else float(temperature)
    students = gate_episodes(
        student, environment, tasks, rollout, seed=seed, temperature=temp, batch_size=batch_size
    )
    return score_state_gate(
        teacher,
        environment,
        tasks,
        students,
        rollout,
        temperature=temp,
        recovery=recovery,
        privileged_rule=privileged_rule,
    )


def configured_state_gate(
    teacher: Any,
    student: Any,
    environment: ToolEnvironment,
    tasks: Sequence[Task],
    config: Any,
    *,
    fit_task_ids: Iterable[str],
) -> StateGateResult:
    """The held-out state gate as a run's config defines it: episode seeds from ``run.seed``,
    rollouts batched by ``eval.batch_size`` at ``rollout.temperature``, the privileged rule
    of ``lab.teacher_gate``. The benchmark's cold start scores through here, and so does a
    script that gates a teacher it fitted itself, so both see the same states."""
    return evaluate_state_gate(
        teacher,
        student,
        environment,
        tasks,
        config.rollout,
        seed=config.run.seed,
        fit_task_ids=fit_task_ids,
        batch_size=config.eval.batch_size,
        privileged_rule=lab_of(config).teacher_gate.privileged,
    )


def state_gate_thresholds(gate: Any) -> dict[str, float]:
    """The recipe's held-out gate thresholds that are set (``lab.teacher_gate``)."""
    pairs = {
        "on_path_agreement": gate.on_path,
        "off_path_agreement": gate.off_path,
        "recovery_rate": gate.recovery,
    }
    return {k: float(v) for k, v in pairs.items() if v is not None}


def state_gate_failures(result: StateGateResult, thresholds: Mapping[str, float]) -> list[str]:
    """One line per threshold the result misses (a figure with nothing scored misses)."""
    failures = []
    for name, threshold in thresholds.items():
        value = getattr(result, name)
        if value is None or value < threshold:
            shown = "nothing scored" if value is None else f"{value:.3f}"
            failures.append(f"{name} {shown} < {threshold:.3f}")
    return failures


def record_state_gate(
    result: StateGateResult,
    thresholds: Mapping[str, float],
    directory: str | Path,
    events: Any = None,
) -> Path:
    """Write ``teacher-state-gate.json`` (figures, thresholds, passed) and emit an event."""
    failures = state_gate_failures(result, thresholds)
    path = Path(directory) / STATE_GATE_FILE
    passed = not failures
    write_json(
        path,
        {
            **result.to_dict(),
            "thresholds": dict(thresholds),
            "passed": passed,
            "failures": failures,
        },
    )
    if events is not None:
        events.emit(
            "teacher_state_gate",
            echo=f"held-out states: on-path top-1 {_fmt(result.on_path_agreement)}, off-path "
            f"{_fmt(result.off_path_agreement)} ({result.privileged_predictions} privileged), "
            f"recovery {_fmt(result.recovery_rate)}",
            passed=passed,
            failures=failures,
            on_path_agreement=result.on_path_agreement,
            off_path_agreement=result.off_path_agreement,
            recovery_rate=result.recovery_rate,
            privileged_predictions=result.privileged_predictions,
        )
    return path


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


@dataclass(frozen=True)
class GateSubject:
    """What the gate of a set-up run reads: the models, the environment, the validation tasks.

    The harness that owns a trainer fills it from the trainer's fields
    (``lab/benchmark/cell_runner.py::gate_subject``), so the gate reads only what it scores; ``directory`` and ``events``
    say where the result is recorded.
    """

    teacher: Any
    student: Any
    environment: ToolEnvironment
    eval_tasks: Sequence[Task]
    config: Any
    directory: Path
    events: Any = None
    fit_task_ids: Sequence[str] = ()


def run_teacher_gate(subject: GateSubject, *, record: bool = True) -> TeacherGateResult:
    """The gate of a set-up run (e.g. the benchmark's cold start, after ``train()``).

    The student is the run's current student (the cold start), the teacher its teacher, the
    tasks the first ``lab.teacher_gate.tasks`` of the ``eval`` split. With ``record`` the
    result goes to ``<directory>/teacher-gate.json`` and the run's event log.
    """
    cfg = subject.config
    if subject.teacher is None:
        raise TeacherGateError(
            "the teacher gate needs a teacher, and this run has none",
            hint="the gate applies to distillation runs (run.mode other than sft)",
        )
    result = _configured_gate(
        subject.teacher, subject.student, subject.environment, subject.eval_tasks, cfg
    )
    if record:
        record_teacher_gate(
            result, lab_of(cfg).teacher_gate.threshold, subject.directory, subject.events
        )
    return result


def cold_start_teacher_gate(subject: GateSubject) -> dict[str, Any]:
    """The gate of a finished cold start, as the benchmark records it (``teacher_gate``).

    Where the recipe sets a held-out state threshold (``lab.teacher_gate.on_path``,
    ``_off_path``, ``_recovery``), the state gate (:func:`evaluate_state_gate`, recorded in
    ``teacher-state-gate.json``) decides ``passed`` and its figures are under ``states``; the
    turn-start figures stay beside them.

    ``{value, threshold, passed, actions, off_path_accuracy, oracle_state_accuracy}`` after
    :func:`run_teacher_gate` (recorded in the run directory and its event log), or
    ``{skipped: true, reason, threshold, passed: None, value: None}`` where no gate can be
    computed: no teacher, or an environment without an oracle to say what the correct next
    action is. A skipped gate never refuses a benchmark; the stop-or-go check reports it as
    not measured, with the reason. The teacher is any backend that scores rows (the toy
    teacher, the smoothed oracle, an hf teacher adapter on the shared backbone). With
    ``lab.teacher_gate.required: false`` the record carries ``required: false``: the
    figures are measured and stored, and :func:`refuse_failed_gates` lets the arms run on
    an ungated teacher.
    """
    cfg = subject.config
    threshold = float(lab_of(cfg).teacher_gate.threshold)
    reason = None
    tasks = list(subject.eval_tasks)[: lab_of(cfg).teacher_gate.tasks]
    if subject.teacher is None:
        reason = "the cold start has no teacher"
    elif not tasks:
        reason = "the eval split holds no tasks"
    else:
        try:
            oracle_tool_results(subject.environment, tasks[0])
        except (NotImplementedError, ToolEnvironmentError) as err:
            reason = f"environment {cfg.environment.name!r} has no oracle state ({err})"
    if reason is not None:
        if subject.events is not None:
            subject.events.emit(
                "teacher_gate", echo=f"teacher gate skipped: {reason}", skipped=True, reason=reason
            )
        return {
            "skipped": True,
            "reason": reason,
            "value": None,
            "threshold": threshold,
            "passed": None,
        }
    result = run_teacher_gate(subject)
    out: dict[str, Any] = {
        "value": result.value,
        "threshold": threshold,
        "passed": bool(result.actions) and result.value >= threshold,
        "actions": result.actions,
        "off_path_actions": result.off_path_actions,
        "off_path_accuracy": result.off_path_accuracy,
        "oracle_state_accuracy": result.oracle_state_accuracy,
        "tasks": len(tasks),
    }
    thresholds = state_gate_thresholds(lab_of(cfg).teacher_gate)
    if thresholds:
        states = configured_state_gate(
            subject.teacher,
            subject.student,
            subject.environment,
            tasks,
            cfg,
            fit_task_ids=subject.fit_task_ids,
        )
        record_state_gate(states, thresholds, subject.directory, subject.events)
        failures = state_gate_failures(states, thresholds)
        out["states"] = {
            "on_path_agreement": states.on_path_agreement,
            "off_path_agreement": states.off_path_agreement,
            "recovery_rate": states.recovery_rate,
            "privileged_predictions": states.privileged_predictions,
            "thresholds": thresholds,
            "failures": failures,
        }
        out["passed"] = not failures
    if not lab_of(cfg).teacher_gate.required:
        out["required"] = False
    return out


def refuse_failed_gates(cold_starts: Sequence[dict[str, Any]]) -> None:
    """Raise :class:`TeacherGateError` when any seed's recorded gate failed (skipped gates,
    and gates recorded with ``required: false``, pass)."""
    for cold in cold_starts:
        gate = cold.get("teacher_gate") or {}
        if gate.get("passed") is False and gate.get("required", True):
            states = (gate.get("states") or {}).get("failures") or []
            value, threshold = gate.get("value") or 0.0, gate.get("threshold") or 0.0
            parts = (
                [
                    f"the teacher reproduces the correct next action at {value:.3f} of "
                    f"{gate.get('actions')} student-visited states, under lab.teacher_gate.threshold "
                    f"{threshold:.3f}"
                ]
                if value < threshold or not states
                else []
            )
            if states:
                parts.append("the held-out state gate failed (" + "; ".join(states) + ")")
            what = "; ".join(parts)
            raise TeacherGateError(
                f"teacher gate failed for seed {cold.get('seed')}: {what}; "
                "no benchmark arm was started and no benchmark.json was written",
                hint="train the teacher longer or on more corrective traces (a teacher checkpoint: "
                "its own recipe, e.g. train.sft_noise_fraction; the lab's toy fit: "
                "lab.toy_fit.max_steps, lab.toy_fit.noise_fraction); lower the thresholds "
                "(lab.teacher_gate.*) only knowingly, before any arm runs (the cold start is "
                "stored and reused only under the same base config)",
            )


def load_teacher_gate(directory: str | Path) -> dict[str, Any]:
    """The stored gate record of a run directory (JSON only)."""
    return dict(read_json(Path(directory) / TEACHER_GATE_FILE))


__all__ = [
    "DEFAULT_THRESHOLD",
    "STATE_GATE_FILE",
    "TEACHER_GATE_FILE",
    "GateState",
    "GateSubject",
    "StateGateResult",
    "TeacherGateResult",
    "cold_start_teacher_gate",
    "configured_state_gate",
    "continue_from",
    "evaluate_state_gate",
    "evaluate_teacher_gate",
    "first_off_path_turns",
    "gate_episodes",
    "gate_of_weight_files",
    "gate_states",
    "load_teacher_gate",
    "privileged_prediction",
    "record_state_gate",
    "record_teacher_gate",
    "recovery_outcomes",
    "refuse_failed_gates",
    "require_disjoint",
    "require_teacher_gate",
    "run_teacher_gate",
    "score_state_gate",
    "score_teacher_gate",
    "state_gate_failures",
    "state_gate_thresholds",
    "teacher_reproduces",
]
