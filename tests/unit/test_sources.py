"""Sample sources with fake collaborators: provenance, the on-policy refusal, resume position."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from helpers import ScriptedBackend, calculator, calculator_tasks, final_text, tiny_config
from miniverl.agent.loop import RolloutRunner
from miniverl.config.models import RolloutConfig
from miniverl.errors import OffPolicyError
from miniverl.models.fingerprint import backend_fingerprint
from miniverl.training import sources as S
from miniverl.training.recipe import OPDTrainer, apply_update
from miniverl.training.run_state import RunState
from miniverl.trajectory.io import read_trajectories
from miniverl.trajectory.masks import model_target_positions
from miniverl.utils.logging import EventLog, make_console


class Policy(ScriptedBackend):
    """A scripted policy with weights, so the runner stamps a real fingerprint."""

    def __init__(self, answer: str, weight: float) -> None:
        super().__init__([], default=final_text(answer))
        self.weights = [torch.full((3,), weight)]

    def trainable_parameters(self) -> list[torch.Tensor]:
        return self.weights

    def set_train(self, mode: bool) -> None:
        pass


class NoProgress:
    def task(self, name: str, total: int) -> Any:
        from contextlib import nullcontext

        return nullcontext(lambda **_: None)


class FakeScorer:
    """Copies the rollout's fingerprint onto its targets, as ``LocalTeacherScorer`` does."""

    def __init__(self, fingerprint: str | None = "rollout") -> None:
        self.fingerprint = fingerprint
        self.scored: list[str] = []

    def score_batch(self, items: list[Any]) -> list[Any]:
        out = []
        for traj, alignment, _view in items:
            self.scored.append(traj.trajectory_id)
            stamp = traj.metadata.get("policy_fingerprint")
            out.append(
                SimpleNamespace(
                    provider=None,
                    teacher_entropy=[0.5] * alignment.num_positions,
                    policy_fingerprint=stamp if self.fingerprint == "rollout" else self.fingerprint,
                    entropy_is_lower_bound=False,
                    shape="exact",
                )
            )
        return out


def _hard_labels(traj: Any, version: int) -> tuple[S.TrainingSample, None]:
    sample = S.hard_label_sample(traj)
    sample.rollout_policy_version = version
    sample.rollout_fingerprint = traj.metadata.get("policy_fingerprint")
    return sample, None


def _events(tmp_path: Path) -> EventLog:
    return EventLog(tmp_path / "events.jsonl", make_console(True))


def _targets(tmp_path: Path, scorer: FakeScorer) -> S.TeacherTargets:
    return S.TeacherTargets(
        scorer=scorer,
        cache=None,
        spec=None,  # type: ignore[arg-type]
        select_and_align=_hard_labels,
        batch_size=2,
        events=_events(tmp_path),
    )


def _runner(policy: Policy) -> RolloutRunner:
    return RolloutRunner(backend=policy, environment=calculator(), config=RolloutConfig())


def _generated(traj: Any) -> list[int]:
    return [t for t, m in zip(traj.token_ids, traj.model_generated_mask, strict=True) if m]


# ------------------------------------------------------------------ oracle


def test_oracle_source_yields_the_oracle_token_ids(tmp_path: Path) -> None:
    runner = _runner(Policy("7", 1.0))
    tasks = calculator_tasks(3)
    source = S.OracleSource(
        runner=runner, version=lambda: 4, trajectory_log=tmp_path / "t.jsonl", tasks_per_cycle=3
    )
    batch = source.samples(-2, tasks)
    assert source.supervision == S.Supervision(phase="sft", teacher_targets=False)
    assert batch.rollout_version is None and batch.rollout_stats == {}
    for task, sample in zip(tasks, batch.samples, strict=True):
        oracle = runner.oracle_rollout(task)
        assert sample.trajectory.token_ids == oracle.token_ids
        assert sample.trajectory.metadata["source"] == "oracle"
        assert sample.trajectory_id == f"{task.task_id}:oracle:c-2"
        positions = model_target_positions(oracle.model_generated_mask)
        assert sample.selection.positions == positions
        assert sample.alignment.target_token_ids == [oracle.token_ids[p] for p in positions]
        assert sample.rollout_policy_version == 4
    logged = read_trajectories(tmp_path / "t.jsonl")
    assert [t.trajectory_id for t in logged] == [s.trajectory_id for s in batch.samples]
    again = source.samples(-1, tasks)
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert ['"same_as": ' in line for line in lines] == [False] * 3 + [True] * 3
    logged = read_trajectories(tmp_path / "t.jsonl")
    assert logged[3:] == [s.trajectory for s in again.samples]


def test_sft_noise_replaces_a_seeded_share_of_traces_by_corrective_ones(tmp_path: Path) -> None:
    """train.sft_noise_fraction (DART-style): a corrective trace's corrupted call is context,
    never a target; its flagged observation and the re-call follow; the rest are oracle traces."""
    from miniverl.agent.corrective import targets_outside
    from miniverl.environments.calc_chain import generate_tasks
    from miniverl.environments.registry import make_environment

    env = make_environment("calc_chain", checked=True)
    config = RolloutConfig(
        max_turns=9, max_new_tokens_per_turn=40, max_total_tokens=900, max_parse_errors=3
    )
    runner = RolloutRunner(ScriptedBackend([]), env, config)
    tasks = generate_tasks("train", 40, 1, (2, 3))

    def source(fraction: float, seed: int = 5) -> Any:
        return S.OracleSource(
            runner=runner,
            version=lambda: 0,
            trajectory_log=tmp_path / f"t-{fraction}-{seed}.jsonl",
            tasks_per_cycle=40,
            noise_fraction=fraction,
            seed=seed,
        )

    noisy = source(0.5).samples(3, tasks).samples
    corrective = [s for s in noisy if s.trajectory.metadata["source"] == "noisy_oracle"]
    assert 10 <= len(corrective) <= 30  # a seeded half, not all or none
    for sample in corrective:
        traj = sample.trajectory
        bad = traj.metadata["corrupted_turn"]
        assert not traj.turns[bad].tool_result or not traj.turns[bad].tool_result.ok  # flagged
        assert sample.selection.positions == targets_outside(traj, [bad])
        corrupted = {j for sp in traj.spans if sp.is_model_generated and sp.turn_id == bad
                     for j in range(sp.start, sp.end)}  # fmt: skip
        assert corrupted and not corrupted & set(sample.selection.positions)
        assert traj.solved
    for sample in noisy:
        if sample not in corrective:
            oracle = runner.oracle_rollout(tasks[noisy.index(sample)])
            assert sample.trajectory.token_ids == oracle.token_ids
    again = [s.trajectory.token_ids for s in source(0.5).samples(3, tasks).samples]
    assert again == [s.trajectory.token_ids for s in noisy]  # seeded
    clean = source(0.0).samples(3, tasks).samples
    assert all(s.trajectory.metadata["source"] == "oracle" for s in clean)


# ------------------------------------------------------------------ on-policy


def _on_policy(tmp_path: Path, student: Policy, *, fingerprint: Any, scorer: FakeScorer) -> Any:
    return S.OnPolicySource(
        runner=_runner(student),
        student=student,
        targets=_targets(tmp_path, scorer),
        config=tiny_config("train.opd_freshness=strict"),
        version=lambda: 5,
        step=lambda: 2,
        fingerprint=fingerprint,
        events=_events(tmp_path),
        progress=NoProgress(),
        trajectory_log=tmp_path / "t.jsonl",
    )


def test_on_policy_source_yields_ids_sampled_by_the_student(tmp_path: Path) -> None:
    student, teacher = Policy("11", 1.0), Policy("22", 2.0)
    scorer = FakeScorer()
    source = _on_policy(
        tmp_path, student, fingerprint=lambda: backend_fingerprint(student), scorer=scorer
    )
    tasks = calculator_tasks(3)
    batch = source.samples(0, tasks)
    said = student.tokenizer.encode(final_text("11"))
    assert said != teacher.tokenizer.encode(final_text("22"))
    assert batch.rollout_version == 5 and batch.rollout_stats["tasks"] == 3
    for sample in batch.samples:
        assert _generated(sample.trajectory) == said
        assert sample.rollout_fingerprint == backend_fingerprint(student)
        assert sample.rollout_fingerprint != backend_fingerprint(teacher)
        assert sample.target_fingerprint == sample.rollout_fingerprint
        assert sample.trajectory.policy_version == 5
    assert scorer.scored == [s.trajectory_id for s in batch.samples]
    assert source.supervision.strict_on_policy and source.supervision.teacher_targets
    assert source.expected_version(3) == 5, "strict: the cache read expects the current version"


def test_on_policy_source_refuses_rollouts_of_a_foreign_fingerprint(tmp_path: Path) -> None:
    student, teacher = Policy("11", 1.0), Policy("22", 2.0)
    source = _on_policy(
        tmp_path, student, fingerprint=lambda: backend_fingerprint(teacher), scorer=FakeScorer()
    )
    with pytest.raises(OffPolicyError, match="was sampled by weights with policy fingerprint"):
        source.samples(0, calculator_tasks(2))


def test_on_policy_source_refuses_targets_of_other_weights(tmp_path: Path) -> None:
    student = Policy("11", 1.0)
    source = _on_policy(
        tmp_path,
        student,
        fingerprint=lambda: backend_fingerprint(student),
        scorer=FakeScorer(fingerprint="fp-of-something-else"),
    )
    with pytest.raises(OffPolicyError, match="teacher targets"):
        source.samples(0, calculator_tasks(2))


def test_on_policy_source_refuses_targets_that_carry_no_fingerprint(tmp_path: Path) -> None:
    student = Policy("11", 1.0)
    source = _on_policy(
        tmp_path,
        student,
        fingerprint=lambda: backend_fingerprint(student),
        scorer=FakeScorer(fingerprint=None),
    )
    with pytest.raises(OffPolicyError, match="produced for policy fingerprint None"):
        source.samples(0, calculator_tasks(2))


# ------------------------------------------------------------------ offline pool


def _offline(tmp_path: Path, teacher_runner: Any) -> S.OfflinePoolSource:
    return S.OfflinePoolSource(
        teacher_runner=teacher_runner,
        targets=_targets(tmp_path, FakeScorer()),
        pool_tasks=calculator_tasks(5),
        config=tiny_config("train.rollouts_per_cycle=2"),
        version=lambda: 1,
        events=_events(tmp_path),
        trajectory_log=tmp_path / "t.jsonl",
    )


def _never() -> RolloutRunner:
    raise AssertionError("a resumed offline pool must not roll out the teacher again")


def test_offline_pool_resumes_at_the_same_position(tmp_path: Path) -> None:
    teacher = Policy("22", 2.0)
    first = _offline(tmp_path, lambda: _runner(teacher))
    walked = [s.trajectory_id for c in range(3) for s in first.samples(c, []).samples]
    assert len(set(walked)) == 5 and walked[5] == walked[0], "the walk wraps around the pool"
    state = first.state_dict()
    assert state["cursor"] == 6 and state["version"] == 1 and len(state["pool"]) == 5
    upcoming = [s.trajectory_id for s in first.samples(3, []).samples]

    resumed = _offline(tmp_path, _never)
    resumed.load_state_dict(state)
    batch = resumed.samples(3, [])
    assert [s.trajectory_id for s in batch.samples] == upcoming == walked[1:3]
    assert batch.rollout_version is None
    for sample in batch.samples:
        assert _generated(sample.trajectory) == teacher.tokenizer.encode(final_text("22"))
        assert sample.rollout_fingerprint == backend_fingerprint(teacher)


# ------------------------------------------------------------------ the recipe


def test_build_source_maps_each_mode(tmp_path: Path) -> None:
    student = Policy("1", 1.0)
    kinds = {}
    for mode in ("sft", "offline_kd", "opd", "seqkd", "kd_oracle", "gkd_mix"):
        kinds[mode] = type(
            S.build_source(
                mode,
                config=tiny_config(f"run.mode={mode}"),
                student_runner=_runner(student),
                student=student,
                teacher_runner=_never,
                targets=_targets(tmp_path, FakeScorer()),
                train_tasks=calculator_tasks(2),
                version=lambda: 0,
                step=lambda: 0,
                fingerprint=lambda: None,
                events=_events(tmp_path),
                progress=NoProgress(),
                trajectory_log=tmp_path / "t.jsonl",
            )
        )
    assert kinds == {
        "sft": S.OracleSource,
        "offline_kd": S.OfflinePoolSource,
        "opd": S.OnPolicySource,
        "seqkd": S.TeacherSampleSource,
        "kd_oracle": S.OracleSource,
        "gkd_mix": S.MixedPrefixSource,
    }
    with pytest.raises(ValueError, match="no sample source"):
        names = list(inspect.signature(S.build_source).parameters)[1:]
        S.build_source("nope", **dict.fromkeys(names))  # type: ignore[arg-type]


CYCLE_METHODS = (
    "train",
    "loss_step",
    "_cycles",
    "_groups",
    "_log_step",
    "_end_cycle",
    "_end_warmup_cycle",
    "next_tasks",
)
CYCLE_CODE = (
    {name: getattr(OPDTrainer, name) for name in CYCLE_METHODS}
    | {"RunState.next_tasks": RunState.next_tasks}
    | {"apply_update": apply_update}
)


@pytest.mark.parametrize("name", list(CYCLE_CODE))
def test_the_cycle_never_reads_the_mode(name: str) -> None:
    """Mode decisions live in setup and ``build_source``; the cycle asks the source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(CYCLE_CODE[name])))
    reads = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in {"mode", "opd_freshness"}
    ]
    compares = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(
            isinstance(c, ast.Constant)
            and c.value in {"sft", "opd", "offline_kd", "seqkd", "kd_oracle", "gkd_mix"}
            for c in node.comparators
        )
    ]
    assert reads == [] and compares == []


def test_kd_oracle_scores_the_oracle_token_ids(tmp_path: Path) -> None:
    """kd_oracle: the oracle's ids, every one scored by the teacher (the example of docs/design.md §4)."""
    runner = _runner(Policy("7", 1.0))
    scorer = FakeScorer()
    source = S.OracleSource(
        targets=_targets(tmp_path, scorer),
        runner=runner,
        version=lambda: 0,
        trajectory_log=tmp_path / "t.jsonl",
        tasks_per_cycle=2,
    )
    tasks = calculator_tasks(2)
    batch = source.samples(0, tasks)
    assert source.supervision == S.Supervision(phase="kd_oracle", teacher_targets=True)
    assert [s.trajectory.token_ids for s in batch.samples] == [
        runner.oracle_rollout(t).token_ids for t in tasks
    ]
    assert scorer.scored == [s.trajectory_id for s in batch.samples]
    assert all(s.teacher_entropy and ":kd-oracle:c0" in s.trajectory_id for s in batch.samples)
    source.samples(1, tasks)
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert len(lines) == 4 and all('"token_ids": [' in line for line in lines)  # budgets count them


def _teacher_sampled(tmp_path: Path, teacher: Policy) -> S.TeacherSampleSource:
    return S.TeacherSampleSource(
        teacher_runner=lambda: _runner(teacher),
        config=tiny_config("run.mode=seqkd"),
        version=lambda: 3,
        events=_events(tmp_path),
        trajectory_log=tmp_path / "t.jsonl",
    )


def test_seqkd_trains_on_fresh_teacher_sampled_ids_as_hard_labels(tmp_path: Path) -> None:
    student, teacher = Policy("11", 1.0), Policy("22", 2.0)
    source = _teacher_sampled(tmp_path, teacher)
    tasks = calculator_tasks(3)
    first, second = source.samples(0, tasks), source.samples(1, tasks)
    said = teacher.tokenizer.encode(final_text("22"))
    assert said != student.tokenizer.encode(final_text("11"))
    assert source.supervision == S.Supervision(phase="seqkd", teacher_targets=False)
    for sample in first.samples:
        assert _generated(sample.trajectory) == said
        assert sample.trajectory.metadata["policy_fingerprint"] == backend_fingerprint(teacher)
        assert sample.alignment.target_token_ids == [
            sample.trajectory.token_ids[p]
            for p in model_target_positions(sample.trajectory.model_generated_mask)
        ]
    ids = [s.trajectory_id for s in first.samples + second.samples]
    assert len(set(ids)) == 6, "every cycle samples the teacher afresh"
    assert first.rollout_stats == {}, "teacher tokens are not student-generated tokens"
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["teacher_sampled"] for e in events if e["event"] == "rollouts_collected"] == [
        True,
        True,
    ]


def _mixed(tmp_path: Path, student: Policy, teacher: Policy, fingerprint: Any) -> Any:
    on_policy = _on_policy(tmp_path, student, fingerprint=fingerprint, scorer=FakeScorer())
    return S.MixedPrefixSource(
        on_policy=on_policy, teacher_runner=lambda: _runner(teacher), student_fraction=0.5
    )


def test_gkd_mix_mixes_student_and_teacher_prefixes_per_batch(tmp_path: Path) -> None:
    student, teacher = Policy("11", 1.0), Policy("22", 2.0)
    source = _mixed(tmp_path, student, teacher, lambda: backend_fingerprint(student))
    tasks = calculator_tasks(4)
    batch = source.samples(0, tasks)
    by = {backend_fingerprint(student): "11", backend_fingerprint(teacher): "22"}
    split = source.split(0, 4)
    assert sum(split) == 2 and split == source.split(0, 4), "λ = 0.5, seeded"
    assert [s.trajectory.task_id for s in batch.samples] == [t.task_id for t in tasks]
    for is_student, sample in zip(split, batch.samples, strict=True):
        answer = by[sample.trajectory.metadata["policy_fingerprint"]]
        assert answer == ("11" if is_student else "22")
        assert _generated(sample.trajectory) == student.tokenizer.encode(final_text(answer))
        assert sample.provider is None and sample.teacher_entropy, "all scored by the teacher"
    assert batch.rollout_stats["tasks"] == 2, "only the student's rollouts count as its tokens"
    assert not source.supervision.strict_on_policy and source.supervision.teacher_targets
    assert sum(S.MixedPrefixSource(
        on_policy=source.on_policy, teacher_runner=lambda: _runner(teacher), student_fraction=0.25
    ).split(0, 8)) == 2  # fmt: skip


@pytest.mark.parametrize("fraction", [0.0, 1.0])
def test_gkd_mix_at_the_ends_is_all_teacher_or_all_student(tmp_path: Path, fraction: float) -> None:
    student, teacher = Policy("11", 1.0), Policy("22", 2.0)
    source = _mixed(tmp_path, student, teacher, lambda: backend_fingerprint(student))
    source.student_fraction = fraction
    batch = source.samples(0, calculator_tasks(3))
    want = backend_fingerprint(student if fraction else teacher)
    assert [s.trajectory.metadata["policy_fingerprint"] for s in batch.samples] == [want] * 3


def test_gkd_mix_refuses_student_rollouts_of_a_foreign_fingerprint(tmp_path: Path) -> None:
    student, teacher = Policy("11", 1.0), Policy("22", 2.0)
    source = _mixed(tmp_path, student, teacher, lambda: backend_fingerprint(teacher))
    with pytest.raises(OffPolicyError, match="was sampled by weights with policy fingerprint"):
        source.samples(0, calculator_tasks(4))


@pytest.mark.parametrize(
    ("overrides", "round_trip"),
    [(("memory.strategy=resident",), True), (("cache.enabled=false",), False)],
    ids=["cached", "no-cache"],
)
def test_the_teacher_target_path_is_recorded(
    tmp_path: Path, overrides: tuple[str, ...], round_trip: bool
) -> None:
    trainer = OPDTrainer(
        tiny_config("train.cycles=1", *overrides), output_dir=tmp_path / "run", quiet=True
    )
    trainer.train()
    events = [
        json.loads(line) for line in trainer.paths.events.read_text().splitlines() if line.strip()
    ]
    [path] = [e for e in events if e["event"] == "teacher_targets_path"]
    assert path["teacher_resident"] is trainer.resolved.memory_plan.teacher_resident
    assert path["cache"] is round_trip and path["disk_round_trip"] is round_trip
    assert (path["reason"] == S.RESIDENT_ROUND_TRIP_REASON) is round_trip
    assert (trainer.paths.teacher_cache / "index.json").exists() is round_trip
