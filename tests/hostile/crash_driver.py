"""Kill a tiny toy run at every failpoint, recover it, and compare with an uninterrupted run.

Run as a script (``python tests/hostile/crash_driver.py WORKDIR``); ``test_crash_matrix.py``
does. The parent imports torch and miniverl once and never computes anything, then forks
one child per run (a fork after torch has *run* could deadlock its thread pools; after a
bare import it is safe), so each killed run and each resume costs seconds, not an import.

Steps:

1. a reference run with ``MINIVERL_FAILPOINT_TRACE`` lists every failpoint in order;
2. for each failpoint name, its first hit and (if it repeats) its last hit are targets;
   a fresh run is killed there with ``MINIVERL_FAILPOINT`` (``os._exit``), then recovered
   with ``miniverl train --resume`` unless ``eval.json`` shows it already finished;
3. a few points get ``MINIVERL_FAILPOINT_ENOSPC`` instead (a full disk): the run must fail
   with a ``RunStorageError`` message, leave no temporary file or torn log line, and resume;
4. every recovered run is compared with the reference: final adapter and optimizer tensors
   bit-identical, ``metrics.jsonl`` and ``eval.json`` equal up to timing fields, every JSONL
   file whole, the teacher cache valid.

Prints one JSON object on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

RECIPE = """\
run: {name: crash, seed: 1234}
models:
  backend: toy
  device: cpu
  student: {model_id: toy-student, lora: {enabled: false}}
  teacher: {model_id: toy-teacher}
  toy_fit: {max_steps: 2, check_every: 2, batch_size: 2, probe_tasks: 1, reuse: false}
environment: {name: calculator, train_tasks: 4, eval_tasks: 1}
rollout: {max_turns: 2, max_new_tokens_per_turn: 8, max_total_tokens: 120}
loss: {top_k: 4}
cache: {keep_versions: 1}
train: {cycles: 2, rollouts_per_cycle: 2, sft_warmup_cycles: 1, lr: 0.003}
"""

VOLATILE = {
    "seconds",
    "wall_seconds",
    "cpu_seconds",
    "train_selected_tokens_per_second",
    "gpu",
    "time",
    "monotonic_s",
    "run_id",
}


def stable(value: Any) -> Any:
    """``value`` without timing fields and the run directory's name, at any depth."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


ENOSPC_TARGETS = (
    "write:state.json:before_rename",
    "append:metrics.jsonl:partial",
    "write:index.json:before_rename",
    "write:eval.json:before_rename",
    "append:events.jsonl:partial",
)


def run_cli(args: list[str], env: dict[str, str], log: Path) -> int:
    """``miniverl <args>`` in a forked child with extra environment; its exit status."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.environ.update(env)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            from miniverl.cli.main import app

            try:
                app(args, prog_name="miniverl")
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 99
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def train(recipe: Path, out: Path, log: Path, env: dict[str, str], resume: bool = False) -> int:
    args = ["train", str(recipe), "--output", str(out), "--quiet", "--no-report"]
    return run_cli([*args, "--resume"] if resume else args, env, log)


def stable_lines(path: Path) -> list[dict[str, Any]]:
    return [stable(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def compare(reference: Path, run: Path) -> list[str]:
    """Differences between a recovered run and the reference (empty: identical)."""
    from safetensors.torch import load_file

    from miniverl.cache.store import TeacherCache
    from miniverl.errors import MiniverlError

    problems = []
    for name in ("adapter.safetensors", "optimizer.safetensors"):
        a = load_file(str(reference / "checkpoints" / "final" / name))
        b_path = run / "checkpoints" / "final" / name
        if not b_path.is_file():
            problems.append(f"missing {name}")
            continue
        b = load_file(str(b_path))
        if a.keys() != b.keys() or any(not bool((a[k] == b[k]).all()) for k in a):
            problems.append(f"final {name} differs")
    try:
        if stable_lines(reference / "metrics.jsonl") != stable_lines(run / "metrics.jsonl"):
            problems.append("metrics.jsonl differs")
    except (OSError, ValueError) as exc:
        problems.append(f"metrics.jsonl unreadable: {exc}")
    ref_eval = json.loads((reference / "eval.json").read_text())
    run_eval = json.loads((run / "eval.json").read_text()) if (run / "eval.json").is_file() else {}
    if stable(ref_eval) != stable(run_eval):
        problems.append("eval.json differs")
    for log in run.glob("*.jsonl"):
        data = log.read_bytes()
        if data and not data.endswith(b"\n"):
            problems.append(f"{log.name} ends with a torn line")
        for line in data.splitlines():
            try:
                json.loads(line)
            except ValueError:
                problems.append(f"{log.name} holds an unreadable line")
                break
    leftovers = [p.name for p in run.rglob("*.tmp")]
    if leftovers:
        problems.append(f"temporary files left: {leftovers}")
    try:
        TeacherCache.open(run / "teacher-cache").validate()
    except MiniverlError as exc:
        problems.append(f"cache invalid: {exc.message}")
    return problems


SUBSET = (
    "write:config.submitted.yaml:before_rename",
    "write:toy-teacher.safetensors:after_rename",
    "append:metrics.jsonl:partial",
    "checkpoint:warmup:staged",
    "write:shard-*:before_rename",
    "write:index.json:after_rename",
    "append:trajectories.jsonl:partial@last",
    "checkpoint:final:staged",
    "append:metrics.jsonl:partial@last",
    "append:events.jsonl:partial@last",
    "write:eval.json:before_rename",
)
"""Representative points for the default CI run: before the manifest, during the teacher fit,
a torn line before the first checkpoint, each checkpoint stage, the cache, the last cycle, after
the final checkpoint and before ``eval.json``. ``MINIVERL_CRASH_MATRIX=full`` runs every point."""


def select(targets: list[str], trace: list[str], full: bool) -> list[str]:
    if full:
        return targets
    counts: dict[str, int] = {}
    for name in trace:
        counts[name] = counts.get(name, 0) + 1
    chosen = []
    for pattern in SUBSET:
        base, _, nth = pattern.partition("@")
        prefix, star, suffix = base.partition("*")
        names = (
            [n for n in counts if n.startswith(prefix) and n.endswith(suffix)] if star else [base]
        )
        for name in names[:1]:
            if name in counts:
                chosen.append(
                    f"{name}@{counts[name]}" if nth == "last" and counts[name] > 1 else name
                )
    return chosen


def targets_from_trace(trace: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    for name in trace:
        counts[name] = counts.get(name, 0) + 1
    targets = []
    for name, count in counts.items():
        targets.append(name)
        if count > 1:
            targets.append(f"{name}@{count}")
    return targets


def main(workdir: Path) -> dict[str, Any]:
    import miniverl.cli.main
    import miniverl.training.recipe  # noqa: F401

    workdir.mkdir(parents=True, exist_ok=True)
    recipe = workdir / "crash.yaml"
    recipe.write_text(RECIPE)
    trace_file = workdir / "trace.txt"
    reference = workdir / "reference"
    started = time.perf_counter()
    rc = train(
        recipe, reference, workdir / "reference.log", {"MINIVERL_FAILPOINT_TRACE": str(trace_file)}
    )
    if rc != 0:
        return {"error": f"reference run failed ({rc}): {(workdir / 'reference.log').read_text()}"}
    trace = trace_file.read_text().split()
    full = os.environ.get("MINIVERL_CRASH_MATRIX") == "full"
    targets = select(targets_from_trace(trace), trace, full)
    only = os.environ.get("MINIVERL_CRASH_ONLY")  # debugging: one target, no ENOSPC cases
    if only:
        targets = [t for t in targets_from_trace(trace) if t == only]
    results: dict[str, dict[str, Any]] = {}
    runs: list[tuple[str, Path]] = []
    for i, target in enumerate(targets):
        out = workdir / f"kill-{i:03d}"
        log = workdir / f"kill-{i:03d}.log"
        rc = train(recipe, out, log, {"MINIVERL_FAILPOINT": target})
        entry: dict[str, Any] = {"kill_rc": rc}
        if rc == 86:
            finished = (out / "eval.json").is_file()
            entry["recovery"] = "none (finished)" if finished else "--resume"
            if not finished:
                entry["resume_rc"] = train(
                    recipe, out, workdir / f"resume-{i:03d}.log", {}, resume=True
                )
                if entry["resume_rc"] != 0:
                    entry["resume_log"] = (workdir / f"resume-{i:03d}.log").read_text()[-2000:]
        else:
            entry["log"] = log.read_text()[-2000:]
        results[target] = entry
        runs.append((target, out))
    enospc: dict[str, dict[str, Any]] = {}
    for i, target in enumerate(() if only else ENOSPC_TARGETS if full else ENOSPC_TARGETS[:3]):
        out = workdir / f"enospc-{i:03d}"
        log = workdir / f"enospc-{i:03d}.log"
        rc = train(recipe, out, log, {"MINIVERL_FAILPOINT_ENOSPC": target})
        text = log.read_text()
        entry = {
            "rc": rc,
            "message": " ".join(text.split())[:400],
            "leftover_tmp": [p.name for p in out.rglob("*.tmp")],
            "torn_logs": [
                p.name
                for p in out.glob("*.jsonl")
                if p.read_bytes() and not p.read_bytes().endswith(b"\n")
            ],
        }
        entry["resume_rc"] = train(
            recipe, out, workdir / f"enospc-resume-{i:03d}.log", {}, resume=True
        )
        enospc[target] = entry
        runs.append((f"enospc:{target}", out))
    # Only now does this process compute anything (no more forks follow).
    for target, out in runs:
        problems = compare(reference, out)
        (enospc[target[7:]] if target.startswith("enospc:") else results[target])["problems"] = (
            problems
        )
    return {
        "failpoints": sorted(set(trace)),
        "full": full,
        "targets": targets,
        "results": results,
        "enospc": enospc,
        "seconds": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), indent=1, sort_keys=True))
