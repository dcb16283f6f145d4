"""``miniverl export``: a shareable ``result.json`` with no identifying data (docs/design.md §6).

A run directory is safe to keep but not necessarily to publish: a manifest written on
someone's workstation can name local model paths, and a hand-edited or older
``environment.json`` may carry more than :func:`miniverl.utils.env.collect_environment`
writes today. Export therefore copies by allow-list, never by deny-list: hardware is
reduced to named GPU / OS / library fields, ``run_dir`` to its directory name, and every
string that survives is scrubbed of absolute paths (reduced to their last component, so
a model loaded from ``/home/<user>/models/X`` is still identifiable as ``X``).
Torch-free: it reads only JSON and YAML.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path, PureWindowsPath
from typing import Any

from miniverl import __version__
from miniverl.errors import RunDirectoryError
from miniverl.inspection.run_dir import (
    eval_tag_files,
    read_config,
    read_json_or_none,
    require_directory,
)
from miniverl.utils.env import FLOAT_KERNEL_FLAGS, NUMERIC_ENV_VARS, TRACKED_PACKAGES
from miniverl.utils.io import write_json
from miniverl.utils.logging import utc_now
from miniverl.utils.runs import RunPaths

_SAFE_VALUE = re.compile(r"^[A-Za-z0-9 _.,:;+=()\-]{0,128}$")
_POSIX_PATH = re.compile(r"(?<![\w.~/-])(?:~/?|/)[^\s/\\\"'<>|]+(?:/[^\s/\\\"'<>|]*)*")
_WINDOWS_PATH = re.compile(r"\b[A-Za-z]:\\(?:[^\s\\\"'<>|]+\\)*[^\s\\\"'<>|]*")
_HOME_ROOTS = frozenset({"home", "Users", "root", "u", "usr"})
_GPU_DEVICE_FIELDS = ("name", "total_memory_gib", "capability")

OBJECTIVE_MANIFEST_FIELDS = (
    "mode",
    "seed",
    "deterministic",
    "config_digest",
    "miniverl_version",
    "git_commit",
    "global_optimizer_step",
    "parameter_version",
)


def _safe_scalar(value: Any) -> Any:
    """Numbers, booleans and None pass; a string passes only if it is short and path-free."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str) and _SAFE_VALUE.match(value):
        return value
    return None


def _copy_fields(source: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(source, Mapping):
        return {}
    return {key: _safe_scalar(source.get(key)) for key in fields if key in source}


def sanitize_hardware(env: Mapping[str, Any]) -> dict[str, Any]:
    """The allow-listed part of an ``environment.json``: Python, OS, CPU count, GPU, library versions.

    Everything else — hostname, user, home directory, working directory, any environment
    variable outside the five numeric ones (and those only with plain values) — is
    dropped, whatever the input happens to contain.
    """
    gpu_in = env.get("gpu") if isinstance(env.get("gpu"), Mapping) else {}
    devices = gpu_in.get("devices") if isinstance(gpu_in.get("devices"), list) else []
    gpu = _copy_fields(gpu_in, ("status", "count", "cuda"))
    if devices:
        gpu["devices"] = [
            _copy_fields(d, _GPU_DEVICE_FIELDS) for d in devices if isinstance(d, Mapping)
        ]
    packages_in = env.get("packages") if isinstance(env.get("packages"), Mapping) else {}
    env_vars_in = env.get("env_vars") if isinstance(env.get("env_vars"), Mapping) else {}
    cpu_in = env.get("cpu") if isinstance(env.get("cpu"), Mapping) else {}
    isa_in = cpu_in.get("isa") if isinstance(cpu_in.get("isa"), list) else []
    return {
        "python": _copy_fields(env.get("python"), ("version", "implementation")),
        "os": _copy_fields(env.get("os"), ("system", "release", "machine")),
        "cpu_count": env.get("cpu_count") if isinstance(env.get("cpu_count"), int) else None,
        "byteorder": env.get("byteorder") if env.get("byteorder") in ("little", "big") else None,
        "cpu": {
            "model": _safe_scalar(cpu_in.get("model")),
            "isa": [flag for flag in FLOAT_KERNEL_FLAGS if flag in isa_in],
        },
        "gpu": gpu,
        "packages": {
            name: _safe_scalar(packages_in.get(name))
            for name in TRACKED_PACKAGES
            if name in packages_in
        },
        "env_vars": {
            name: env_vars_in[name]
            for name in NUMERIC_ENV_VARS
            if name in env_vars_in and _safe_scalar(env_vars_in[name]) is not None
        },
    }


def _basename(match: re.Match[str]) -> str:
    """The last component of a matched path; a bare home directory becomes ``<path>``."""
    text = match.group(0)
    parts = [
        p
        for p in (PureWindowsPath(text).parts[1:] if "\\" in text else text.split("/"))
        if p and p != "~"
    ]
    if (
        not parts
        or (text.startswith("~") and len(parts) == 1)
        or (len(parts) <= 2 and parts[0] in _HOME_ROOTS)
    ):
        return "<path>"
    return parts[-1]


def scrub(value: Any) -> Any:
    """Recursively reduce every absolute or home-relative path inside strings to its last component."""
    if isinstance(value, str):
        return _POSIX_PATH.sub(_basename, _WINDOWS_PATH.sub(_basename, value))
    if isinstance(value, Mapping):
        return {scrub(str(k)): scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value


def _models(manifest: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for role, spec in (manifest.get("models") or {}).items():
        if isinstance(spec, Mapping):
            out[str(role)] = {
                "model_id": spec.get("model_id"),
                "revision": spec.get("revision"),
                "quantization": spec.get("quantization"),
                "precision": spec.get("precision"),
            }
    return out


def _environment_block(manifest: Mapping[str, Any]) -> dict[str, Any]:
    env = manifest.get("environment") or {}
    return {key: env[key] for key in ("name", "difficulty", "split_sizes", "tools") if key in env}


def _teacher_fit(report: Any) -> dict[str, Any] | None:
    if not isinstance(report, Mapping):
        return None
    keys = (
        "steps",
        "final_loss",
        "stopped_early",
        "fit_tasks",
        "extra_tasks",
        "train_success",
        "heldout_success",
        "weights_sha256",
    )
    return {k: report.get(k) for k in keys if k in report}


def _present(path: Path) -> bool:
    """Exists in any form: a FIFO or dangling link is then refused by the loader, not skipped."""
    return path.exists() or path.is_symlink()


def _evaluations(paths: RunPaths) -> dict[str, Any]:
    out: dict[str, Any] = {}
    summary = read_json_or_none(paths.eval_json)
    if summary is not None:
        out["summary"] = {
            key: summary.get(key)
            for key in (
                "mode",
                "objective",
                "config_digest",
                "global_optimizer_step",
                "parameter_version",
                "seconds",
            )
        }
        out["stages"] = summary.get("evaluations") or {}
    tagged = {
        tag: {k: v for k, v in payload.items() if k != "path"}
        for tag, payload in eval_tag_files(paths).items()
    }
    if tagged:
        out["tagged"] = tagged
    return out


def build_result(run_dir: str | Path) -> dict[str, Any]:
    """The shareable result of a run or benchmark directory (not yet written)."""
    paths = require_directory(run_dir)
    manifest = read_json_or_none(paths.manifest)
    benchmark = read_json_or_none(paths.benchmark_json)
    if manifest is None and benchmark is None and not _present(paths.eval_json):
        raise RunDirectoryError(
            f"{paths.root} holds no {paths.manifest.name}, {paths.eval_json.name} or {paths.benchmark_json.name}",
            hint="export a finished run or benchmark directory",
        )
    result: dict[str, Any] = {
        "schema": "miniverl.result/1",
        "exported_by": f"miniverl {__version__}",
        "exported_at": utc_now(),
        "run_dir": paths.root.resolve().name,
    }
    if manifest is not None:
        result.update({key: manifest.get(key) for key in OBJECTIVE_MANIFEST_FIELDS})
        result["run_id"] = Path(str(manifest.get("run_id") or paths.root.resolve().name)).name
        result["objective"] = manifest.get("objective")
        plan = manifest.get("memory_plan") or {}
        result["memory_plan"] = {
            key: plan.get(key) for key in ("strategy", "requested", "teacher_resident", "reason")
        }
        result["models"] = _models(manifest)
        result["tokenizer"] = {
            key: (manifest.get("tokenizer") or {}).get(key) for key in ("fingerprint", "vocab_size")
        }
        result["environment"] = _environment_block(manifest)
        result["teacher"] = _teacher_fit(manifest.get("teacher"))
    config, _ = read_config(paths)
    if config is not None:
        run_section = config.get("run")
        if isinstance(run_section, dict) and run_section.get("output_dir") is not None:
            run_section["output_dir"] = Path(str(run_section["output_dir"])).name
        result["config"] = config
    result["evaluations"] = _evaluations(paths)
    if benchmark is not None:
        result["benchmark"] = benchmark
    environment = read_json_or_none(paths.environment) or {}
    result["hardware"] = sanitize_hardware(environment if isinstance(environment, Mapping) else {})
    return scrub(result)


def export_run(run_dir: str | Path, out_path: str | Path) -> dict[str, Any]:
    """Write :func:`build_result` to ``out_path`` (atomically) and return it."""
    result = build_result(run_dir)
    write_json(out_path, result)
    return result


__all__ = ["build_result", "export_run", "sanitize_hardware", "scrub"]
