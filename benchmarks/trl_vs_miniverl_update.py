"""One distillation update, two ways: TRL's GKD loss on full logits vs miniverl's top-k + tail.

The student is SmolLM2-135M-Instruct with the LoRA adapter of
``recipes/smollm2_calc_chain.yaml`` (r 16, alpha 32, on q/k/v/o/gate/up/down of every layer);
the teacher is the same base weights with the adapter switched off (peft's
``disable_adapter()``, miniverl's ``HFRoleView``), so each path holds one copy of the model.
A fresh adapter has ``lora_B = 0`` and would make student and teacher identical (KL 0, zero
gradient), so ``lora_B`` is filled with seeded Gaussian noise (``--adapter-noise``) first.

The batch: ``--episodes`` calc_chain tasks (``checked: true``) from the recipe's training
split, rolled out by that perturbed student with the recipe's rollout settings
(``--source student``) or the environment's oracle traces (``--source oracle``); the loss
positions are the recipe's selection (``all_model_tokens``: every model-generated id). Every
arm below reads the same batch file and the same adapter file.

Arms, each alone in a fresh interpreter so that peak resident sets do not mix:

- ``trl``: what ``trl.experimental.gkd.GKDTrainer.compute_loss`` does: a full forward of
  the student (``[B, T, V]`` logits, with grad) and of the teacher (no grad), shift by one,
  labels ``-100`` except at the selected positions, ``GKDTrainer.generalized_jsd_loss(...,
  beta=0)`` with its default ``reduction="batchmean"`` (the sum over selected positions
  divided by their count), then ``backward``. In TRL's code ``beta=0`` is
  ``F.kl_div(student_log_probs, teacher_log_probs)`` = KL(teacher || student), the forward
  KL, and ``beta=1`` the reverse KL. Runs under ``--trl-python`` (TRL is not a miniverl
  dependency; install it in a venv of its own).
- ``bucketed``: the trainer's path (``training/recipe.py``): ``LocalTeacherScorer`` with
  ``loss.mode: bucketed``, ``top_k`` 32 (teacher forward at the selected positions only,
  ``[N, H]``, top-k + tail targets), then the body of ``OPDTrainer.loss_step``: the student's
  ``hidden_states_at_batch`` at the selected positions and ``chunked_selected_position_loss``
  with its two-stage backward. No teacher cache: targets stay where the scorer made them.
- ``exact``: the same with ``loss.mode: exact_full_vocab`` (``ExactTargetProvider`` rebuilds
  ``[chunk, V]`` teacher logits from the teacher's ``[N, H]``).

Timed per pass: teacher targets plus the student's forward, loss and backward (the optimizer
step, the same in every arm, is not timed). The trainer's reduction is a per-trajectory
token mean averaged over trajectories; TRL's is a token mean over the batch. After the timed
passes (and after the peak is read), each arm also computes, untimed, the per-position
divergence at the selected positions and the LoRA gradient of the *batch token mean* (the
miniverl arms by one more ``chunked_selected_position_loss`` pass with unit weights), so the
exact arm can be checked against TRL position by position and gradient by gradient; the trl
and exact arms also differentiate that loss in float64 with respect to the selected student
logits, which tells float32 rounding apart from a different objective.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/trl_vs_miniverl_update.py \\
        --model-dir models/smollm2-135m-instruct --trl-python /work/venv-trl/bin/python

Overrides of the recipe (``key=value``) may follow the options; every arm gets the same.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2_calc_chain.yaml"
ARMS = ("trl", "bucketed", "exact")
TRL_IMPORT = "import trl; from trl.experimental.gkd import GKDTrainer; print(trl.__version__)"
TRL_MISSING = (
    "TRL is not importable by {python}, so the trl arm is skipped. TRL is not a miniverl "
    "dependency; put it in a venv of its own and pass that interpreter:\n"
    "    python3 -m venv /work/venv-trl\n"
    "    /work/venv-trl/bin/pip install torch==2.13.0 trl\n"
    "    /work/venv-trl/bin/pip install -e '.[hf]'\n"
    "    ... --trl-python /work/venv-trl/bin/python"
)


# ============================================================== measurements


def _rss_now_bytes() -> int:
    with open("/proc/self/statm") as handle:
        resident_pages = int(handle.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ============================================================== shared setup


def load_config(args: argparse.Namespace) -> Any:
    """The recipe with the model directory, ``checked: true`` and the caller's overrides."""
    from miniverl.config.models import RunConfig

    overrides = [
        f"models.student.model_id={args.model_dir}",
        f"models.teacher.model_id={args.model_dir}",
        "lab.teacher_fit.enabled=false",
        "environment.params.checked=true",
        f"environment.train_tasks={max(8, args.episodes)}",
        "environment.eval_tasks=1",
        "environment.test_tasks=1",
        *args.overrides,
    ]
    return RunConfig.from_yaml(args.recipe, overrides)


def build_student(config: Any, adapter_file: Path | None) -> Any:
    """The recipe's LoRA student (adapter ``actor``); ``adapter_file`` replaces its weights."""
    from safetensors.torch import load_file

    from miniverl.models.factory import build_tokenizer
    from miniverl.models.hf import HFBackend

    student = HFBackend.from_spec(
        config.models.student,
        tokenizer=build_tokenizer(config),
        device="cpu",
        seed=config.run.seed,
        adapter_name="actor",
    )
    if adapter_file is not None:
        student.load_trainable_state_dict(load_file(str(adapter_file)))
    return student


def lora_gradients(student: Any) -> dict[str, Any]:
    return {
        name: param.grad.detach().clone()
        for name, param in student.model.named_parameters()
        if param.requires_grad and param.grad is not None
    }


def zero_grad(student: Any) -> None:
    for param in student.trainable_parameters():
        param.grad = None


def float64_logit_gradient_error(
    student_logits: Any, teacher_logits: Any, gradient: Any, temperature: float
) -> float | None:
    """Relative L2 error of ``gradient`` (d token-mean forward KL / d student logits, ``[M, V]``).

    The reference is the same KL differentiated in float64 from the same float32 logits. With
    student and teacher close, ``p_student - p_teacher`` cancels in float32, so two correct
    float32 paths differ by about this much; None at a temperature other than 1.
    """

    if temperature != 1.0:
        return None
    s64 = student_logits.detach().double().requires_grad_()
    t64 = teacher_logits.detach().double()
    kl = (t64.softmax(-1) * (t64.log_softmax(-1) - s64.log_softmax(-1))).sum(-1).mean()
    kl.backward()
    assert s64.grad is not None
    return float((gradient.double() - s64.grad).norm() / s64.grad.norm())


# ============================================================== the batch


def make_batch(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Roll out (or render) the episodes, select positions, write batch and adapter files."""
    import torch
    from safetensors.torch import save_file

    from miniverl.agent.loop import EpisodeRequest, RolloutRunner
    from miniverl.environments.registry import make_environment
    from miniverl.environments.tasks_file import build_splits
    from miniverl.selection.selectors import select_positions
    from miniverl.trajectory.alignment import build_alignment_map
    from miniverl.trajectory.io import write_trajectories

    torch.set_num_threads(args.threads)
    config = load_config(args)
    student = build_student(config, None)
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for name, param in student.model.named_parameters():
            if param.requires_grad and "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * args.adapter_noise)
    save_file(
        {k: v.contiguous() for k, v in student.trainable_state_dict().items()},
        str(workdir / "adapter.safetensors"),
    )
    environment = make_environment(config.environment.name, **config.environment.params)
    tasks = build_splits(environment, config.environment)["train"][: args.episodes]
    runner = RolloutRunner(student, environment, config.rollout)
    start = time.perf_counter()
    if args.source == "oracle":
        trajectories = [runner.oracle_rollout(task) for task in tasks]
    else:
        student.set_train(False)
        requests = [EpisodeRequest(task, args.seed + i) for i, task in enumerate(tasks)]
        trajectories = runner.rollout_batch(requests, policy_version=0)
    seconds = time.perf_counter() - start
    write_trajectories(workdir / "batch.jsonl", trajectories)
    rows = []
    for trajectory in trajectories:
        selection = select_positions(trajectory, config.selection, run_seed=config.run.seed)
        alignment = build_alignment_map(trajectory, selection.positions, selection.weights)
        if alignment.num_positions == 0:
            raise SystemExit(f"episode {trajectory.trajectory_id} has no selected position")
        rows.append(
            {
                "token_ids": list(trajectory.token_ids),
                "positions": list(alignment.student_prediction_positions),
                "weights": [float(w) for w in alignment.token_weights],
                "targets": list(alignment.target_token_ids),
                "success": trajectory.solved,
            }
        )
    batch = {
        "source": args.source,
        "episodes": len(rows),
        "rows": rows,
        "generation_seconds": seconds,
        "pad_token_id": student.tokenizer.pad_token_id,
        "vocab_size": int(student.capabilities.vocab_size),
    }
    (workdir / "batch.json").write_text(json.dumps(batch))
    return {
        "source": args.source,
        "episodes": len(rows),
        "ids": sum(len(r["token_ids"]) for r in rows),
        "longest": max(len(r["token_ids"]) for r in rows),
        "positions": sum(len(r["positions"]) for r in rows),
        "solved": sum(r["success"] for r in rows),
        "generation_seconds": seconds,
        "vocab_size": batch["vocab_size"],
    }


def trajectory_weight_rows(batch: dict[str, Any]) -> list[list[float]]:
    """Each trajectory's weights divided by their sum (the trainer's per-trajectory mean)."""
    return [[w / sum(r["weights"]) for w in r["weights"]] for r in batch["rows"]]


# ============================================================== the trl arm


def run_trl(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """GKDTrainer.compute_loss on the batch: full logits of both, then generalized_jsd_loss."""
    import torch
    from trl.experimental.gkd import GKDTrainer

    torch.set_num_threads(args.threads)
    batch = json.loads((workdir / "batch.json").read_text())
    config = load_config(args)
    student = build_student(config, workdir / "adapter.safetensors")
    model = student.model
    rows = batch["rows"]
    width = max(len(r["token_ids"]) for r in rows)
    input_ids = torch.full((len(rows), width), batch["pad_token_id"], dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for b, row in enumerate(rows):
        input_ids[b, : len(row["token_ids"])] = torch.tensor(row["token_ids"])
        attention_mask[b, : len(row["token_ids"])] = 1
        for position, target in zip(row["positions"], row["targets"], strict=True):
            labels[b, position + 1] = target
    shifted_labels = labels[:, 1:]
    temperature = config.loss.temperature

    def teacher_logits() -> Any:
        with torch.no_grad(), model.disable_adapter():
            return model(input_ids=input_ids, attention_mask=attention_mask).logits

    def update() -> tuple[float, dict[str, float], Any, Any]:
        times: dict[str, float] = {}
        start = time.perf_counter()
        student_out = model(input_ids=input_ids, attention_mask=attention_mask)
        times["student_forward"] = time.perf_counter() - start
        mark = time.perf_counter()
        teacher = teacher_logits()
        times["teacher"] = time.perf_counter() - mark
        mark = time.perf_counter()
        loss = GKDTrainer.generalized_jsd_loss(
            student_logits=student_out.logits[:, :-1, :],
            teacher_logits=teacher[:, :-1, :],
            labels=shifted_labels,
            beta=0.0,
            temperature=temperature,
        )
        loss.backward()
        times["loss_backward"] = time.perf_counter() - mark
        return float(loss.detach()), times, student_out.logits, teacher

    model.train()
    setup_rss, setup_peak = _rss_now_bytes(), _peak_rss_bytes()
    passes = []
    for _ in range(args.repeats):
        zero_grad(student)
        cpu, start = _cpu_seconds(), time.perf_counter()
        loss, times, logits, teacher = update()
        passes.append(
            {"wall": time.perf_counter() - start, "cpu": _cpu_seconds() - cpu, "parts": times}
        )
        if len(passes) < args.repeats:
            del logits, teacher
    peak = _peak_rss_bytes()
    with torch.no_grad():
        per_position = GKDTrainer.generalized_jsd_loss(
            logits[:, :-1, :].detach(),
            teacher[:, :-1, :],
            labels=shifted_labels,
            beta=0.0,
            temperature=temperature,
            reduction="none",
        ).sum(-1)
    torch.save(
        {"per_position": per_position.double(), "grads": lora_gradients(student)},
        workdir / "trl.pt",
    )
    selected = shifted_labels != -100
    leaf = logits[:, :-1, :].detach().clone().requires_grad_()
    GKDTrainer.generalized_jsd_loss(
        leaf, teacher[:, :-1, :], labels=shifted_labels, beta=0.0, temperature=temperature
    ).backward()
    assert leaf.grad is not None
    grad_error = float64_logit_gradient_error(
        leaf.detach()[selected], teacher[:, :-1, :][selected], leaf.grad[selected], temperature
    )
    weights = [w for row in trajectory_weight_rows(batch) for w in row]
    trainer_loss = sum(w * float(d) for w, d in zip(weights, per_position, strict=True)) / len(rows)
    import trl

    return {
        "arm": "trl",
        "trl_version": trl.__version__,
        "loss_token_mean": loss,
        "loss_trajectory_mean": trainer_loss,
        "setup_rss": setup_rss,
        "setup_peak": setup_peak,
        "peak_rss": peak,
        "passes": passes,
        "logits_shape": list(logits.shape),
        "logit_grad_error_vs_float64": grad_error,
    }


# ============================================================== the miniverl arms


def group_gradient(student: Any, group: list[Any], *, chunk_size: int, batch_rows: int) -> Any:
    """The body of ``OPDTrainer.loss_step`` with teacher targets and no sampled-token NLL:
    length-bucketed micro-batches of ``batch_rows`` trajectories, each through
    ``chunked_selected_position_loss`` (``backward=True``) scaled by rows / G, summed into a
    ``GroupResult`` (the group mean)."""
    import torch

    from miniverl.losses import (
        chunked_selected_position_loss,
        concat_providers,
        normalize_trajectory_weights,
    )
    from miniverl.models.batching import build_padded_trajectory_batch, length_buckets
    from miniverl.training.recipe import GroupResult

    for param in student.trainable_parameters():
        param.grad = None
    out = GroupResult()
    for bucket in length_buckets([s.trajectory.length for s in group], batch_rows):
        rows = [group[i] for i in bucket]
        batch = build_padded_trajectory_batch(
            token_ids=[r.trajectory.token_ids for r in rows],
            selected_positions=[r.alignment.student_prediction_positions for r in rows],
            pad_token_id=student.tokenizer.pad_token_id,
            device=student.device,
        )
        hidden = student.hidden_states_at_batch(batch, with_grad=True)
        weights = torch.cat(
            normalize_trajectory_weights([r.alignment.token_weights for r in rows])
        ).to(hidden.device)
        targets = torch.tensor(
            [t for r in rows for t in r.alignment.target_token_ids], device=hidden.device
        )
        out.add(
            chunked_selected_position_loss(
                hidden_states=hidden,
                lm_head=student.project,
                weights=weights,
                weight_normalizer=float(len(rows)),
                provider=concat_providers([r.provider for r in rows]),
                target_token_ids=targets,
                ce_weight=0.0,
                chunk_size=chunk_size,
                backward=True,
                loss_scale=len(rows) / len(group),
                span_types=[t for r in rows for t in r.alignment.span_types],
            )
        )
    return out


def run_miniverl(args: argparse.Namespace, workdir: Path, mode: str) -> dict[str, Any]:
    """Teacher scoring + the body of ``OPDTrainer.loss_step``, as one trainer update runs them."""
    import torch

    from miniverl.losses import (
        DivergenceSpec,
        ExactTargetProvider,
        chunked_selected_position_loss,
        concat_providers,
    )
    from miniverl.models.batching import build_padded_trajectory_batch
    from miniverl.models.hf_shared import HFRoleView
    from miniverl.selection.selectors import select_positions
    from miniverl.teachers.local import LocalTeacherScorer
    from miniverl.training.resolve import resolve_chunk_size
    from miniverl.training.sources import TrainingSample
    from miniverl.trajectory.alignment import build_alignment_map
    from miniverl.trajectory.io import read_trajectories

    torch.set_num_threads(args.threads)
    batch = json.loads((workdir / "batch.json").read_text())
    config = load_config(args)
    student = build_student(config, workdir / "adapter.safetensors")
    teacher = HFRoleView(student, role="teacher")
    vocab = int(student.capabilities.vocab_size)
    chunk = resolve_chunk_size(config.loss.chunk_size, vocab)
    spec = DivergenceSpec(**config.loss.divergence_kwargs())  # type: ignore[arg-type]
    top_k = int(config.loss.top_k) if isinstance(config.loss.top_k, int) else 64
    scorer = LocalTeacherScorer(
        teacher,
        spec=spec,
        loss_mode=mode,  # type: ignore[arg-type]
        top_k=top_k,
        teacher_resident=True,
        student_fingerprint=student.tokenizer.fingerprint,
        chunk_size=chunk,
    )
    samples = []
    for trajectory in read_trajectories(workdir / "batch.jsonl"):
        selection = select_positions(trajectory, config.selection, run_seed=config.run.seed)
        alignment = build_alignment_map(trajectory, selection.positions, selection.weights)
        samples.append(TrainingSample(trajectory, selection, alignment, 0))
    for sample, row in zip(samples, batch["rows"], strict=True):
        assert list(sample.alignment.student_prediction_positions) == row["positions"]
    micro = args.micro_batch or len(samples)

    def update() -> tuple[Any, dict[str, float]]:
        start = time.perf_counter()
        results = scorer.score_batch([(s.trajectory, s.alignment, None) for s in samples])
        for sample, result in zip(samples, results, strict=True):
            sample.provider = result.provider
        scored = time.perf_counter()
        out = group_gradient(student, samples, chunk_size=chunk, batch_rows=micro)
        done = time.perf_counter()
        return out, {"teacher": scored - start, "student_update": done - scored}

    student.set_train(True)
    setup_rss, setup_peak = _rss_now_bytes(), _peak_rss_bytes()
    passes = []
    for _ in range(args.repeats):
        cpu, start = _cpu_seconds(), time.perf_counter()
        out, times = update()
        passes.append(
            {"wall": time.perf_counter() - start, "cpu": _cpu_seconds() - cpu, "parts": times}
        )
    peak = _peak_rss_bytes()

    # Untimed cross-check: per-position divergence and the batch-token-mean gradient.
    padded = build_padded_trajectory_batch(
        [s.trajectory.token_ids for s in samples],
        [s.alignment.student_prediction_positions for s in samples],
        pad_token_id=student.tokenizer.pad_token_id,
    )
    provider = concat_providers([s.provider for s in samples])
    targets = torch.tensor([t for s in samples for t in s.alignment.target_token_ids])
    zero_grad(student)
    hidden = student.hidden_states_at_batch(padded, with_grad=True)
    with torch.no_grad():
        per_position = torch.cat(
            [
                provider.divergence(
                    student.project(hidden[i : i + chunk].detach()), i, min(i + chunk, len(targets))
                ).divergence.double()
                for i in range(0, len(targets), chunk)
            ]
        )
    token_mean = chunked_selected_position_loss(
        hidden_states=hidden,
        lm_head=student.project,
        weights=torch.ones(len(targets)),
        weight_normalizer=len(targets),
        provider=provider,
        target_token_ids=targets,
        ce_weight=0.0,
        chunk_size=chunk,
        backward=True,
    )
    arm = "bucketed" if mode == "bucketed" else "exact"
    torch.save(
        {"per_position": per_position, "grads": lora_gradients(student)}, workdir / f"{arm}.pt"
    )
    grad_error = None
    if isinstance(provider, ExactTargetProvider):
        with torch.no_grad():
            student_logits = student.project(hidden.detach())
            teacher_logits = provider.teacher_lm_head(provider.teacher_hidden)
        leaf = student_logits.clone().requires_grad_()
        chunked_selected_position_loss(
            hidden_states=leaf,
            lm_head=lambda logits: logits,
            weights=torch.ones(len(targets)),
            weight_normalizer=len(targets),
            provider=provider,
            target_token_ids=targets,
            ce_weight=0.0,
            chunk_size=chunk,
            backward=True,
        )
        grad_error = float64_logit_gradient_error(
            student_logits, teacher_logits, leaf.grad, spec.temperature
        )
    return {
        "arm": arm,
        "loss_trajectory_mean": out.loss,
        "loss_token_mean": token_mean.loss,
        "teacher_entropy_mean": out.entropy_sum / out.entropy_positions
        if out.entropy_positions
        else None,
        "chunk_size": chunk,
        "top_k": top_k if mode == "bucketed" else vocab,
        "micro_batch": micro,
        "logit_grad_error_vs_float64": grad_error,
        "setup_rss": setup_rss,
        "setup_peak": setup_peak,
        "peak_rss": peak,
        "passes": passes,
    }


# ============================================================== the driver


def _child_env() -> dict[str, str]:
    env = os.environ.copy()
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return env


def _forwarded(args: argparse.Namespace, workdir: Path) -> list[str]:
    return [
        *("--model-dir", str(args.model_dir), "--recipe", str(args.recipe)),
        *("--episodes", str(args.episodes), "--source", args.source),
        *("--seed", str(args.seed), "--adapter-noise", str(args.adapter_noise)),
        *("--repeats", str(args.repeats), "--threads", str(args.threads)),
        *("--micro-batch", str(args.micro_batch), "--workdir", str(workdir)),
        *args.overrides,
    ]


def _spawn(python: str, stage: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    command = [python, os.path.abspath(__file__), "--stage", stage, *_forwarded(args, workdir)]
    proc = subprocess.run(command, capture_output=True, text=True, env=_child_env())
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"stage {stage} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def trl_version(python: str) -> str | None:
    """TRL's version under ``python``, or None when it cannot import the GKD trainer."""
    try:
        proc = subprocess.run(
            [python, "-c", TRL_IMPORT], capture_output=True, text=True, env=_child_env()
        )
    except OSError:
        return None
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 else None


def compare(workdir: Path, arms: list[str]) -> dict[str, Any]:
    """Per-position divergences and batch-token-mean LoRA gradients, arm against arm."""
    import torch

    saved = {arm: torch.load(workdir / f"{arm}.pt") for arm in arms}

    def pair(a: str, b: str) -> dict[str, float]:
        da, db = saved[a]["per_position"], saved[b]["per_position"]
        ga = torch.cat([saved[a]["grads"][k].flatten().double() for k in sorted(saved[a]["grads"])])
        gb = torch.cat([saved[b]["grads"][k].flatten().double() for k in sorted(saved[a]["grads"])])
        return {
            "max_abs_position_diff": float((da - db).abs().max()),
            "max_rel_position_diff": float(((da - db).abs() / db.abs().clamp_min(1e-12)).max()),
            "grad_rel_l2_diff": float((ga - gb).norm() / gb.norm()),
            "grad_cosine": float(torch.nn.functional.cosine_similarity(ga, gb, dim=0)),
            "min_position_gap": float((db - da).min()),
        }

    out: dict[str, Any] = {}
    if "exact" in saved and "trl" in saved:
        out["exact_vs_trl"] = pair("exact", "trl")
    if "bucketed" in saved and "exact" in saved:
        out["bucketed_vs_exact"] = pair("bucketed", "exact")
    return out


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f}"


def report(batch: dict[str, Any], results: dict[str, dict[str, Any]], checks: dict) -> None:
    print(
        f"batch: {batch['episodes']} calc_chain episodes (checked: true, source {batch['source']}), "
        f"{batch['ids']} ids (longest {batch['longest']}), {batch['positions']} selected positions, "
        f"{batch['solved']} solved; V = {batch['vocab_size']:,}; built in "
        f"{batch['generation_seconds']:.1f} s"
    )
    header = (
        f"{'arm':<9} {'best wall s':>11} {'cpu s':>7} {'setup GiB':>9} {'peak GiB':>8} "
        f"{'above setup':>11} {'loss (trainer)':>14} {'loss (token mean)':>17}"
    )
    print(
        "loss (trainer): per-trajectory token mean averaged over trajectories, miniverl's "
        "reduction (trl: its per-position KL re-weighted so)\n"
        "loss (token mean): the sum over selected positions / their count, TRL's batchmean "
        "(miniverl: the untimed cross-check pass)\n"
        "memory: resident set; setup = before the first pass, peak = ru_maxrss\n"
    )
    print(header)
    print("-" * len(header))
    for arm, r in results.items():
        best = min(r["passes"], key=lambda p: p["wall"])
        print(
            f"{arm:<9} {best['wall']:11.2f} {best['cpu']:7.2f} {_gib(r['setup_rss']):>9} "
            f"{_gib(r['peak_rss']):>8} {_gib(r['peak_rss'] - r['setup_rss']):>11} "
            f"{r['loss_trajectory_mean']:14.6f} {r['loss_token_mean']:17.6f}"
        )
        parts = ", ".join(f"{k} {v:.2f}" for k, v in best["parts"].items())
        walls = ", ".join(f"{p['wall']:.2f}" for p in r["passes"])
        print(f"          best pass: {parts}; every pass: {walls} s")
    if "trl" in results:
        trl = results["trl"]
        for arm in ("bucketed", "exact"):
            if arm in results:
                r = results[arm]
                print(
                    f"trl / {arm}: wall {_best(trl) / _best(r):.2f}x, cpu "
                    f"{_best(trl, 'cpu') / _best(r, 'cpu'):.2f}x, peak "
                    f"{trl['peak_rss'] / r['peak_rss']:.2f}x, above setup "
                    f"{(trl['peak_rss'] - trl['setup_rss']) / (r['peak_rss'] - r['setup_rss']):.2f}x"
                )
    for name, c in checks.items():
        print(
            f"{name}: per position max |diff| {c['max_abs_position_diff']:.2e} "
            f"(relative {c['max_rel_position_diff']:.2e}); token-mean LoRA gradient relative "
            f"L2 diff {c['grad_rel_l2_diff']:.2e}, cosine {c['grad_cosine']:.6f}"
        )
    errors = {
        arm: r["logit_grad_error_vs_float64"]
        for arm, r in results.items()
        if r.get("logit_grad_error_vs_float64") is not None
    }
    if errors:
        print(
            "d(token-mean KL)/d(student logits) at the selected positions, relative L2 error "
            "against float64: " + ", ".join(f"{arm} {e:.2e}" for arm, e in errors.items())
        )
    if "bucketed_vs_exact" in checks:
        gap = checks["bucketed_vs_exact"]["min_position_gap"]
        print(f"exact - bucketed per position: min {gap:.2e} (bucketing can only lower a KL)")


def _best(result: dict[str, Any], key: str = "wall") -> float:
    return min(p[key] for p in result["passes"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    parser.add_argument("--recipe", type=Path, default=RECIPE)
    parser.add_argument(
        "--trl-python",
        default=sys.executable,
        help="interpreter with TRL installed for the trl arm (default: this one)",
    )
    parser.add_argument(
        "--arms", default=",".join(ARMS), help="comma-separated subset of " + ",".join(ARMS)
    )
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--source", choices=("student", "oracle"), default="student")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--adapter-noise",
        type=float,
        default=0.02,
        help="std of the seeded noise put in lora_B so the student differs from the teacher",
    )
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per arm")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per arm")
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=0,
        help="trajectories per student forward of the miniverl arms (train.trajectory_batch_size; "
        "0: all at once, which the trl arm always does)",
    )
    parser.add_argument("--workdir", type=Path, help="keep the batch and arm files here")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="recipe overrides key=value")
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or args.episodes < 1 or args.repeats < 1:
        parser.error(f"unknown arm(s) {unknown}" if unknown else "--episodes and --repeats >= 1")

    if args.stage:
        workdir = Path(args.workdir)
        if args.stage == "batch":
            out = make_batch(args, workdir)
        elif args.stage == "trl":
            out = run_trl(args, workdir)
        else:
            out = run_miniverl(
                args, workdir, "exact_full_vocab" if args.stage == "exact" else "bucketed"
            )
        print(json.dumps(out))
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        version = trl_version(args.trl_python) if "trl" in arms else None
        if "trl" in arms and version is None:
            print(TRL_MISSING.format(python=args.trl_python))
            arms.remove("trl")
        elif version is not None:
            print(f"TRL {version} under {args.trl_python}")
        batch = _spawn(sys.executable, "batch", args, workdir)
        results = {}
        for arm in arms:
            python = args.trl_python if arm == "trl" else sys.executable
            results[arm] = _spawn(python, arm, args, workdir)
        checks = compare(workdir, arms)
        report(batch, results, checks)
        if args.json:
            args.json.write_text(
                json.dumps({"batch": batch, "arms": results, "checks": checks}, indent=2)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
