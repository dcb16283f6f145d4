"""Shared builders for the test suite (no torch).

Import with ``from helpers import ...``; ``tests/conftest.py`` puts this directory on
``sys.path``. Everything here is deliberately general so other test files can reuse it:

- :class:`ScriptedBackend`: a policy that replays scripted generations through the
  ``CausalLMBackend.generate`` contract, emulating stop sequences, EOS and
  ``max_new_tokens`` exactly the way ``models/sampling.py::run_generation`` does;
- trajectory builders (oracle rollouts, hand-built span partitions) and JSONL writers
  for raw, possibly tampered, records;
- subprocess helpers that run code against ``src/`` with a chosen ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from miniverl.agent.loop import RolloutRunner
from miniverl.agent.protocol import format_final, format_tool_call
from miniverl.agent.transcript import TranscriptBuilder
from miniverl.config.models import RolloutConfig
from miniverl.environments.base import Task, ToolCall, ToolEnvironment, make_splits
from miniverl.environments.registry import make_environment
from miniverl.models.base import GenerationResult
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.schemas.trajectory import (
    MODEL_GENERATED_SPAN_TYPES,
    SpanType,
    TerminationReason,
    Trajectory,
    Turn,
)
from miniverl.trajectory.io import write_trajectories

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
TOY_CALCULATOR = REPO_ROOT / "recipes" / "toy_calculator.yaml"
"""The smallest toy recipe (one-step calculator tasks, a teacher fitted on oracle traces)."""
SRC_DIR = REPO_ROOT / "src"

_TOKENIZER: ToyTokenizer | None = None


def toy_tokenizer() -> ToyTokenizer:
    """One shared :class:`ToyTokenizer` (its fingerprint is computed once)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = ToyTokenizer()
    return _TOKENIZER


# ------------------------------------------------------------------ scripted policy


@dataclass
class GenerateCall:
    """What the runner asked the backend for (recorded by :class:`ScriptedBackend`)."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop_sequences: tuple[str, ...]


@dataclass
class ScriptedBackend:
    """A deterministic stand-in policy for ``RolloutRunner``.

    ``script`` holds one entry per ``generate`` call: a ``str`` is tokenized with the
    canonical ``tokenizer.encode``; a ``list[int]`` is emitted verbatim (use it for
    non-canonical id sequences or an explicit EOS id). Each entry is "sampled" one id at
    a time with the same ending rules as ``run_generation``:

    - the EOS id ends generation (kept in ``token_ids``, dropped from ``text``);
    - a stop sequence appearing in the decoded ids so far ends generation (the ids that
      produced it are kept, everything scripted after them is never sampled);
    - ``max_new_tokens`` ids end generation.

    An entry that runs out before any of these is reported as ``max_new_tokens``: the
    scripted model has nothing more to say, which a real sampler would only stop at its
    budget. When the script is exhausted ``generate`` raises ``AssertionError`` (a test
    asked for more turns than it scripted), unless ``default`` is given.
    """

    script: list[str | list[int]]
    tokenizer: Any = field(default_factory=toy_tokenizer)
    model_id: str = "toy-student"
    revision: str | None = None
    default: str | list[int] | None = None
    calls: list[GenerateCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.script = list(self.script)
        self.capabilities = SimpleNamespace(model_id=self.model_id, revision=self.revision)

    @property
    def device(self) -> str:
        return "cpu"

    def generate(
        self,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_sequences: tuple[str, ...] = (),
    ) -> GenerationResult:
        self.calls.append(
            GenerateCall(
                list(prompt_ids), max_new_tokens, temperature, top_p, seed, tuple(stop_sequences)
            )
        )
        if self.script:
            entry = self.script.pop(0)
        elif self.default is not None:
            entry = self.default
        else:
            raise AssertionError(
                f"ScriptedBackend: script exhausted after {len(self.calls) - 1} generate calls"
            )
        planned = (
            self.tokenizer.encode(entry) if isinstance(entry, str) else [int(i) for i in entry]
        )
        return emulate_generation(
            planned,
            tokenizer=self.tokenizer,
            max_new_tokens=max_new_tokens,
            stop_sequences=stop_sequences,
            num_prompt_tokens=len(prompt_ids),
        )


def emulate_generation(
    planned: Sequence[int],
    *,
    tokenizer: Any,
    max_new_tokens: int,
    stop_sequences: Sequence[str] = (),
    num_prompt_tokens: int = 0,
) -> GenerationResult:
    """Replay ``planned`` ids through the ending rules of ``run_generation``."""
    stops = tuple(s for s in stop_sequences if s)
    eos = tokenizer.eos_token_id
    token_ids: list[int] = []
    finish = "max_new_tokens"
    matched: str | None = None
    for token in planned:
        if len(token_ids) >= max_new_tokens:
            break
        token_ids.append(token)
        if token == eos:
            finish = "eos"
            break
        text = tokenizer.decode(token_ids)
        hits = [(text.find(s), -len(s), s) for s in stops if s in text]
        if hits:
            matched = min(hits)[2]
            finish = "stop_sequence"
            break
    text_ids = token_ids[:-1] if finish == "eos" else token_ids
    return GenerationResult(
        token_ids=token_ids,
        text=tokenizer.decode(text_ids),
        finish_reason=finish,  # type: ignore[arg-type]
        stop_sequence=matched,
        num_prompt_tokens=num_prompt_tokens,
    )


def char_ids(text: str, tokenizer: Any = None) -> list[int]:
    """One id per character: a valid but NON-canonical encoding of ASCII ``text``."""
    tok = tokenizer or toy_tokenizer()
    return [tok.token_to_id(c) for c in text]


def tool_call_text(expression: str, name: str = "calculator") -> str:
    """The canonical ``<tool_call>`` block the oracle would emit for ``expression``."""
    return format_tool_call(ToolCall(name, {"expression": expression}))


def final_text(answer: str) -> str:
    return format_final(answer)


def chain_call(task: Task, step: int) -> str:
    """The oracle's call of step ``step`` of a calc_chain task, as a policy writes it."""
    return tool_call_text(task.data["expressions"][step])


def miscopied_step(task: Task, step: int) -> str:
    """Step ``step``'s expression with its first operand (the previous result) off by 10."""
    op, y = task.data["steps"][step]
    symbol = {"add": "+", "subtract": "-", "multiply": "*"}[op]
    return f"{task.data['results'][step - 1] + 10} {symbol} {y}"


# ------------------------------------------------------------------ environments, tasks


def calculator(prompt_style: str = "compact") -> ToolEnvironment:
    return make_environment("calculator", prompt_style=prompt_style)


def calculator_tasks(
    n: int = 4,
    *,
    difficulty: str = "easy",
    seed: int = 7,
    split: str = "train",
    prompt_style: str = "compact",
) -> list[Task]:
    env = calculator(prompt_style)
    counts = {"train": 0, "eval": 0, "test": 0}
    counts[split] = n
    return make_splits(env, counts=counts, seed=seed, difficulty=difficulty)[split]  # type: ignore[arg-type]


def make_runner(
    script: Iterable[str | list[int]] = (),
    *,
    environment: ToolEnvironment | None = None,
    config: RolloutConfig | None = None,
    **backend_kwargs: Any,
) -> RolloutRunner:
    backend = ScriptedBackend(list(script), **backend_kwargs)
    return RolloutRunner(
        backend=backend, environment=environment or calculator(), config=config or RolloutConfig()
    )


def oracle_trajectory(
    task: Task | None = None, *, environment: ToolEnvironment | None = None, **kwargs: Any
) -> Trajectory:
    """``RolloutRunner(...).oracle_rollout(task)`` with a scripted backend (never called)."""
    env = environment or calculator()
    task = task or calculator_tasks(1)[0]
    return make_runner(environment=env).oracle_rollout(task, **kwargs)


def oracle_trajectories(n: int = 3, *, difficulty: str = "easy", seed: int = 7) -> list[Trajectory]:
    env = calculator()
    runner = make_runner(environment=env)
    return [
        runner.oracle_rollout(task)
        for task in calculator_tasks(n, difficulty=difficulty, seed=seed)
    ]


# ------------------------------------------------------------------ hand-built trajectories


def make_trajectory(
    segments: Sequence[tuple[SpanType | str, int | Sequence[int]]],
    *,
    trajectory_id: str = "traj-0",
    seed: int = 0,
    with_turns: bool = False,
    segment_keys: Sequence[str] | None = None,
    tokenizer: Any = None,
    termination_reason: TerminationReason = TerminationReason.MAX_TURNS,
) -> Trajectory:
    """A valid trajectory from ``(span_type, length_or_ids)`` segments.

    Lengths are filled with random non-special ids (deterministic in ``seed``). Every
    span gets ``segment_key`` ``seg{i}`` unless ``segment_keys`` is given; model spans
    get ``turn_id`` equal to the number of model spans before them when ``with_turns``.
    """
    tok = tokenizer or toy_tokenizer()
    rng = random.Random(seed)
    builder = TranscriptBuilder(
        tok,
        trajectory_id=trajectory_id,
        task_id="task-0",
        environment="calculator",
        model_id="toy-student",
    )
    model_turn = 0
    for index, (span_type, spec) in enumerate(segments):
        ids = [rng.randrange(10, 186) for _ in range(spec)] if isinstance(spec, int) else list(spec)
        key = segment_keys[index] if segment_keys is not None else f"seg{index}"
        span_type = SpanType(span_type)
        turn_id = model_turn if with_turns else 0
        span = builder.add(span_type, segment_key=key, token_ids=ids, turn_id=turn_id)
        if span is None:
            raise ValueError(f"segment {index} is empty")
        if span_type in MODEL_GENERATED_SPAN_TYPES:
            model_turn += 1 if with_turns else 0
    if with_turns:
        for turn_id in sorted({s.turn_id for s in builder.spans}):
            builder.add_turn(Turn(turn_id=turn_id))
    return builder.build(termination_reason=termination_reason)


def record_of(trajectory: Trajectory) -> dict[str, Any]:
    """The JSON-ready dict ``write_trajectories`` stores for one trajectory."""
    return json.loads(json.dumps(trajectory.model_dump(mode="json")))


def write_records(path: str | os.PathLike[str], records: Iterable[dict[str, Any] | str]) -> Path:
    """Write raw JSONL (dicts are dumped, strings written as-is): for tampered files."""
    path = Path(path)
    lines = [(r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records]
    path.write_text("".join(lines), encoding="utf-8")
    return path


def write_oracle_file(
    path: str | os.PathLike[str], n: int = 3, *, difficulty: str = "easy"
) -> list[Trajectory]:
    """Write ``n`` oracle trajectories with :func:`write_trajectories`; returns them."""
    trajectories = oracle_trajectories(n, difficulty=difficulty)
    write_trajectories(path, trajectories)
    return trajectories


def first_index_of(trajectory: Trajectory, span_type: SpanType | str) -> int:
    """Start index of the first span of ``span_type``."""
    return trajectory.spans_of(span_type)[0].start


# ------------------------------------------------------------------ subprocesses


def subprocess_env(
    *, hash_seed: str | None = None, extra_paths: Sequence[Path] = ()
) -> dict[str, str]:
    """Environment for a child Python that imports miniverl from ``src/``."""
    env = dict(os.environ)
    paths = [str(SRC_DIR), *(str(p) for p in extra_paths)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if hash_seed is not None:
        env["PYTHONHASHSEED"] = hash_seed
    return env


def load_benchmark_script(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as a module: the scripts are files, not a package."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_python(
    code: str,
    *,
    args: Sequence[str] = (),
    hash_seed: str | None = None,
    with_tests: bool = False,
    timeout: float = 120.0,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code ARGS`` against ``src/`` (and ``tests/`` when ``with_tests``)."""
    env = subprocess_env(hash_seed=hash_seed, extra_paths=[TESTS_DIR] if with_tests else [])
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=str(cwd or REPO_ROOT),
        check=False,
    )


def run_cli(
    *args: str, timeout: float = 120.0, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m miniverl.cli.main ARGS`` in a child process."""
    env = subprocess_env()
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "miniverl.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=str(cwd or REPO_ROOT),
        check=False,
    )


TINY_RUN_OVERRIDES: dict[str, Any] = {
    "run": {"name": "tiny", "seed": 1234},
    "models": {
        "backend": "toy",
        "device": "cpu",
        "student": {"model_id": "toy-student", "lora": {"enabled": False}},
        "teacher": {"model_id": "toy-teacher"},
        "toy_fit": {"max_steps": 20, "check_every": 10, "batch_size": 4},
    },
    "environment": {"name": "calculator", "train_tasks": 8, "eval_tasks": 2},
    "rollout": {"max_turns": 2, "max_new_tokens_per_turn": 16, "max_total_tokens": 200},
    "loss": {"top_k": 8},
    "train": {"cycles": 2, "rollouts_per_cycle": 2, "sft_warmup_cycles": 1, "lr": 0.003},
}


def capture_trained_samples(monkeypatch: Any) -> list[tuple[Any, str | None]]:
    """Record every trainable sample the optimizer gets outside the SFT warm-up, with the
    student's fingerprint at that moment: provenance checks read what was trained on, not labels.

    ``monkeypatch`` is pytest's fixture; the returned list fills as the trainer runs.
    """
    from miniverl.config.modes import WARMUP_MODE
    from miniverl.training.recipe import OPDTrainer

    seen: list[tuple[Any, str | None]] = []
    original = OPDTrainer._groups

    def groups(self: Any, samples: Any, supervision: Any) -> Any:
        for group in original(self, samples, supervision):
            if supervision.phase != WARMUP_MODE.name:
                seen.extend((s, self.state.policy_fingerprint) for s in group)
            yield group

    monkeypatch.setattr(OPDTrainer, "_groups", groups)
    return seen


def tiny_config(*overrides: str, base: dict[str, Any] | None = None) -> Any:
    """A seconds-long toy recipe for end-to-end trainer tests, with dotted overrides."""
    from miniverl.config.models import RunConfig, apply_overrides

    return RunConfig.from_mapping(
        apply_overrides(base or TINY_RUN_OVERRIDES, overrides), source="<tiny>"
    )


REPORT_FORBIDDEN = ("http", "//cdn", "<script src", "<script", "<link", "@import", "url(")
"""Strings a self-contained, offline report.html may not contain."""

REPORT_RUN_SECTIONS = (
    "headline",
    "identity",
    "objective",
    "curves",
    "success",
    "failures",
    "provenance",
    "tokens",
    "entropy",
    "selection",
    "memory",
    "events",
)
"""Keys of ``SECTION_TITLES`` every training-run report shows."""


LOSS_PATHS = ("closed_form", "general", "plain")
"""How the losses can compute a registered divergence (:func:`force_loss_path`)."""


def force_loss_path(monkeypatch: Any, name: str, path: str) -> None:
    """Make the losses compute divergence ``name`` by ``path`` for one test.

    ``closed_form``: the registry row as shipped (the fused closed form on all-finite
    full-vocabulary blocks, the fused terms elsewhere); ``general``: the fused terms
    everywhere (the row without its closed form); ``plain``: no fused form, autograd
    through the plain definition. ``monkeypatch`` is pytest's fixture.
    """
    from dataclasses import replace

    from miniverl.losses.divergences import DIVERGENCES, Divergence

    row = DIVERGENCES[name]
    if path == "closed_form":
        return
    if path == "general":
        assert row.fused is not None, f"{name} has no fused form"
        monkeypatch.setitem(
            DIVERGENCES, name, replace(row, fused=replace(row.fused, closed_form=None))
        )
    elif path == "plain":
        monkeypatch.setitem(DIVERGENCES, name, Divergence(row.plain))
    else:
        raise ValueError(f"unknown loss path {path!r}; expected one of {LOSS_PATHS}")


def export_cold_start(trainer: Any, directory: Path, prepared: Any = None) -> Path:
    """Save a finished ``OPDTrainer``'s student (and the lab's ``prepared`` teacher) as a cold
    start, as a benchmark's cold-start cell does (``lab/benchmark/cold_start.py``)."""
    from miniverl.lab.benchmark.cold_start import save_cold_start

    return save_cold_start(
        directory,
        config=trainer.config,
        student=trainer.student,
        teacher=prepared,
        parameter_version=trainer.state.parameter_version,
        global_step=trainer.state.global_step,
        evaluations=trainer.state.eval_results,
    )


def interrupt_cycle(monkeypatch: Any, cycle: int, *, before_checkpoint: bool) -> None:
    """Make ``OPDTrainer.train`` raise ``KeyboardInterrupt`` at recipe cycle ``cycle``: once
    its work and records are done but before its evaluation and checkpoint
    (``before_checkpoint``), or once it ended, checkpoint included (the next cycle never
    starts). ``monkeypatch`` is pytest's fixture (or a ``monkeypatch.context()``)."""
    from miniverl.training.recipe import OPDTrainer

    original = OPDTrainer._after_cycle

    def after_cycle(self: Any, c: int, steps: Any) -> None:
        if c == cycle and before_checkpoint:
            raise KeyboardInterrupt
        original(self, c, steps)
        if c == cycle:
            raise KeyboardInterrupt

    monkeypatch.setattr(OPDTrainer, "_after_cycle", after_cycle)
