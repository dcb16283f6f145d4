"""Foundation: errors, RunPaths, atomic I/O, seeds, lazy imports, environment, logging, gpu."""

from __future__ import annotations

import json
import os
import random
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import run_python
from miniverl import errors
from miniverl.errors import BackendError, MiniverlError
from miniverl.utils import gpu
from miniverl.utils.env import (
    NUMERIC_ENV_VARS,
    collect_environment,
    describe_cpu,
    package_versions,
)
from miniverl.utils.hashing import sha256_bytes, sha256_file
from miniverl.utils.io import (
    append_jsonl,
    atomic_path,
    atomic_write_bytes,
    atomic_write_text,
    publish_modes,
    read_json,
    to_json_text,
    write_json,
)
from miniverl.utils.lazy import INSTALL_HINT, import_torch, is_available, require
from miniverl.utils.logging import EventLog, MetricsLog, make_console
from miniverl.utils.runs import RunPaths
from miniverl.utils.seeding import (
    capture_rng_state,
    derive_seed,
    restore_rng_state,
    seed_everything,
)

# -- errors ---------------------------------------------------------------------------------------


def test_error_hierarchy_and_hints() -> None:
    names = set(errors.__all__)
    assert {
        "ConfigError",
        "SchemaValidationError",
        "TrajectoryError",
        "AlignmentError",
        "TokenizerMismatchError",
        "StaleCacheError",
        "CacheIntegrityError",
        "CheckpointError",
        "GpuMemoryError",
        "ToolEnvironmentError",
    } <= names
    for name in names:
        cls = getattr(errors, name)
        assert issubclass(cls, MiniverlError)
        assert cls.default_hint.strip(), name
        err = cls("something broke")
        assert str(err) == err.message == "something broke"
        assert err.hint == cls.default_hint
        assert err.describe() == f"something broke\n  hint: {cls.default_hint}"
    custom = errors.ConfigError("bad", hint="do this")
    assert custom.hint == "do this" and custom.describe() == "bad\n  hint: do this"
    assert MiniverlError("x", hint="").describe() == "x"
    assert errors.ToolEnvironmentError is not EnvironmentError


# -- RunPaths ---------------------------------------------------------------------------------------

DESIGN_ARTIFACTS = {
    "config_submitted": "config.submitted.yaml",
    "config_validated": "config.validated.yaml",
    "config_original": "config.original.yaml",
    "config_resolved": "config.resolved.yaml",
    "manifest": "manifest.json",
    "environment": "environment.json",
    "metrics": "metrics.jsonl",
    "events": "events.jsonl",
    "trajectories": "trajectories.jsonl",
    "eval_trajectories": "eval_trajectories.jsonl",
    "token_analysis": "token_analysis.jsonl",
    "teacher_cache": "teacher-cache",
    "checkpoints": "checkpoints",
    "final_checkpoint": "checkpoints/final",
    "eval_json": "eval.json",
    "report_html": "report.html",
    "summary_md": "summary.md",
    "benchmark_json": "benchmark.json",
}


def test_run_paths_define_every_artifact(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    assert paths.root == tmp_path / "run"
    for attribute, relative in DESIGN_ARTIFACTS.items():
        assert getattr(paths, attribute) == tmp_path / "run" / relative, attribute
    assert paths.eval_tag_json("baseline") == tmp_path / "run" / "eval.baseline.json"
    assert paths.checkpoint("cycle-3") == tmp_path / "run" / "checkpoints" / "cycle-3"
    assert RunPaths(str(tmp_path)).root == tmp_path
    assert not (tmp_path / "run").exists()  # defining paths creates nothing


@pytest.mark.parametrize("bad", ["../x", "a/b", "", ".hidden", "x" * 65, "tag with space"])
def test_run_paths_reject_unsafe_names(tmp_path: Path, bad: str) -> None:
    paths = RunPaths(tmp_path)
    with pytest.raises(ValueError, match=r"^invalid eval tag "):
        paths.eval_tag_json(bad)
    with pytest.raises(ValueError, match=r"^invalid checkpoint name "):
        paths.checkpoint(bad)


def test_run_paths_are_frozen(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    with pytest.raises(AttributeError):
        paths.root = tmp_path / "other"  # type: ignore[misc]
    assert RunPaths(tmp_path) == paths


# -- atomic I/O --------------------------------------------------------------------------------------


def test_atomic_write_replaces(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "file.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two ✓")
    assert target.read_text(encoding="utf-8") == "two ✓"
    atomic_write_bytes(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.txt"]


def test_atomic_write_keeps_the_old_file_when_the_writer_raises(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_json(target, {"version": 1})
    before = target.read_bytes()
    with pytest.raises(RuntimeError, match="disk on fire"), atomic_path(target) as tmp:
        tmp.write_text('{"version": 2, "half', encoding="utf-8")
        raise RuntimeError("disk on fire")
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temp file left behind
    with pytest.raises(KeyboardInterrupt), atomic_path(target) as tmp:
        tmp.write_text("partial", encoding="utf-8")
        raise KeyboardInterrupt
    assert read_json(target) == {"version": 1}


@pytest.fixture
def restore_umask() -> Iterator[None]:
    """The process umask as it was before the test, whatever the test sets."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _private_file(path: Path, data: bytes = b"x") -> None:
    """Write ``path`` 0600, as safetensors' ``save_file`` does whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


@pytest.mark.parametrize(
    ("mask", "file", "directory"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)]
)
def test_artifacts_get_the_mode_the_umask_gives_a_new_file(
    tmp_path: Path, restore_umask: None, mask: int, file: int, directory: int
) -> None:
    """mkstemp, mkdtemp and safetensors create 0600 files and 0700 directories; an artifact
    renamed into place from them gets ``0o666`` / ``0o777`` less the umask, like
    ``open``/``mkdir``, and an executable stays executable."""
    os.umask(mask)
    write_json(tmp_path / "a.json", {"x": 1})
    with atomic_path(tmp_path / "b.bin") as tmp:
        tmp.unlink()
        _private_file(tmp)  # a writer that replaces the temporary file
    staged = Path(tempfile.mkdtemp(prefix=".out.", dir=tmp_path))
    (staged / "sub").mkdir(mode=0o700)
    _private_file(staged / "sub" / "model.safetensors")
    (staged / "run.sh").write_text("#!/bin/sh\n")
    (staged / "run.sh").chmod(0o700)
    publish_modes(staged)
    modes = {
        p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode)
        for p in tmp_path.rglob("*")
    }
    name = staged.name
    assert modes == {
        "a.json": file,
        "b.bin": file,
        name: directory,
        f"{name}/sub": directory,
        f"{name}/sub/model.safetensors": file,
        f"{name}/run.sh": directory,
    }


def test_json_and_hashes(tmp_path: Path) -> None:
    assert to_json_text({"b": 1, "a": "é"}) == '{\n  "a": "é",\n  "b": 1\n}\n'
    write_json(tmp_path / "x.json", {"b": [1, 2], "a": None})
    assert read_json(tmp_path / "x.json") == {"a": None, "b": [1, 2]}
    assert (
        sha256_bytes(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    (tmp_path / "f").write_bytes(b"abc")
    assert sha256_file(tmp_path / "f") == sha256_bytes(b"abc")


def test_append_jsonl_writes_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "events.jsonl"
    append_jsonl(path, [])
    assert not path.exists()
    append_jsonl(path, [{"b": 1, "a": 2}, {"x": "y"}])
    append_jsonl(path, [{"z": 0}])
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert [json.loads(line) for line in lines] == [{"a": 2, "b": 1}, {"x": "y"}, {"z": 0}]
    assert all(line.endswith("\n") for line in lines)


# -- seeds ------------------------------------------------------------------------------------------------


def test_derive_seed_properties() -> None:
    assert derive_seed(1, 23) != derive_seed(12, 3)
    assert derive_seed("1", 23) != derive_seed(1, 23)
    assert derive_seed(1234, "calc-train-0:v0:s7") == derive_seed(1234, "calc-train-0:v0:s7")
    seeds = {derive_seed(1234, i) for i in range(200)}
    assert len(seeds) == 200 and all(0 <= s < 2**63 for s in seeds)
    assert all(0 <= derive_seed(s, bits=8) < 256 for s in range(50))
    assert 0 <= derive_seed(7, bits=64) < 2**64
    for bits in (0, 65):
        with pytest.raises(ValueError, match=r"bits must be in \[1, 64\]"):
            derive_seed(1, bits=bits)


def test_derive_seed_is_identical_across_processes() -> None:
    code = "from miniverl.utils.seeding import derive_seed; print(derive_seed(1234, 'calc-train-0:v0:s7', 3), hash('x'))"
    outs = []
    for hash_seed in ("1", "2"):
        proc = run_python(code, hash_seed=hash_seed)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout.split())
    assert outs[0][1] != outs[1][1]  # the salted hash does differ ...
    assert (
        outs[0][0] == outs[1][0] == str(derive_seed(1234, "calc-train-0:v0:s7", 3))
    )  # ... the seed does not


def test_seed_everything_and_rng_state_round_trip() -> None:
    seed_everything(5, deterministic=False)
    first = [random.random() for _ in range(3)]
    seed_everything(5, deterministic=False)
    assert [random.random() for _ in range(3)] == first
    state = capture_rng_state()
    json.dumps(state)  # JSON-serializable for checkpoints
    expected = [random.random() for _ in range(5)]
    restore_rng_state(json.loads(json.dumps(state)))
    assert [random.random() for _ in range(5)] == expected


# -- lazy imports --------------------------------------------------------------------------------------------


def test_require_names_the_extra() -> None:
    with pytest.raises(BackendError) as info:
        require("transformers_definitely_missing_xyz", "a test")
    assert (
        str(info.value)
        == "transformers_definitely_missing_xyz is not installed (needed for a test)"
    )
    assert info.value.hint == INSTALL_HINT
    assert require("json").dumps([1]) == "[1]"
    assert is_available("json") and not is_available("definitely_missing_xyz")


def test_import_torch_when_installed() -> None:
    if not is_available("torch"):
        with pytest.raises(BackendError, match="torch is not installed"):
            import_torch("tests")
        return
    assert import_torch("tests").__name__ == "torch"


# -- environment description ------------------------------------------------------------------------------


def test_collect_environment_is_an_allow_list(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "HOME": "/home/alice-secret-home",
        "USER": "alice_secret_user",
        "LOGNAME": "alice_secret_user",
        "SECRET_TOKEN": "hunter2-do-not-leak",
        "HF_TOKEN": "hf_do_not_leak",
        "PWD": "/srv/private/project",
    }
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    numeric = {
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "CUDA_VISIBLE_DEVICES": "0",
        "OMP_NUM_THREADS": "4",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for key, value in numeric.items():
        monkeypatch.setenv(key, value)
    env = collect_environment()
    text = json.dumps(env)
    assert env["env_vars"] == numeric
    assert set(NUMERIC_ENV_VARS) == set(numeric)
    for value in secrets.values():
        assert value not in text
    assert "alice" not in text
    assert str(Path.home()) not in text
    hostname = socket.gethostname()
    if len(hostname) >= 4:
        assert f'"{hostname}"' not in text
    assert os.getcwd() not in text

    def strings(node: object) -> list[str]:
        if isinstance(node, dict):
            return [s for v in node.values() for s in strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    assert not [s for s in strings(env) if s.startswith("/")]  # no absolute paths at all
    assert set(env) == {
        "python",
        "os",
        "cpu_count",
        "cpu",
        "packages",
        "gpu",
        "env_vars",
        "byteorder",
    }


def test_collect_environment_keeps_only_set_numeric_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in NUMERIC_ENV_VARS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert collect_environment()["env_vars"] == {"OMP_NUM_THREADS": "2"}


def test_describe_cpu_names_the_model_and_the_kernel_deciding_flags() -> None:
    """Two processors, two records: the CPU decides the float kernels (utils/env.py)."""
    cpuinfo = (
        "processor\t: 0\nmodel name\t: AMD EPYC 9R14 96-Core Processor\n"
        "flags\t\t: fpu sse avx avx2 fma avx512f avx512bw avx512vl avx512_bf16 sha_ni\n\n"
        "processor\t: 1\nmodel name\t: another core\nflags\t\t: amx_bf16\n"
    )
    assert describe_cpu(cpuinfo) == {
        "model": "AMD EPYC 9R14 96-Core Processor",
        "isa": ["avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16"],
    }
    assert describe_cpu("model name\t: Intel(R) Xeon(R) Processor\nflags\t: avx2 amx_bf16\n")[
        "isa"
    ] == ["avx2", "amx_bf16"]
    here = collect_environment()["cpu"]
    assert set(here) == {"model", "isa"}


def test_package_versions() -> None:
    versions = package_versions(("pydantic", "definitely-missing-pkg-xyz"))
    assert versions["definitely-missing-pkg-xyz"] is None
    assert isinstance(versions["pydantic"], str) and versions["pydantic"][0].isdigit()


# -- logging ------------------------------------------------------------------------------------------------


def test_event_and_metrics_logs(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl", console=make_console(quiet=True))
    record = log.emit("run_start", echo="hello", run_id="r1")
    log.emit("run_end", ok=True)
    lines = [
        json.loads(line)
        for line in (tmp_path / "events.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert [e["event"] for e in lines] == ["run_start", "run_end"]
    assert lines[0]["run_id"] == "r1" and lines[1]["ok"] is True
    assert lines[0] == record and set(record) >= {"event", "time", "monotonic_s"}
    assert log.events == lines
    assert EventLog(None).emit("x")["event"] == "x"
    metrics = MetricsLog(tmp_path / "metrics.jsonl")
    metrics.write({"step": 1, "loss": 0.5})
    assert json.loads((tmp_path / "metrics.jsonl").read_text(encoding="utf-8")) == {
        "loss": 0.5,
        "step": 1,
    }
    assert metrics.records == [{"step": 1, "loss": 0.5}]


# -- gpu probes --------------------------------------------------------------------------------------------


def test_gpu_probes_report_honestly() -> None:
    if gpu.cuda_available():
        assert gpu.snapshot()["status"] == "measured"
        return
    assert gpu.snapshot() == {"status": "not_run_no_cuda"}
    assert gpu.describe_gpu() == {"status": "not_run_no_cuda", "count": 0}
    assert gpu.free_vram_gib() is None
    gpu.reset_peak()  # a no-op, not an error


def test_is_oom_error() -> None:
    assert gpu.is_oom_error(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert not gpu.is_oom_error(RuntimeError("shape mismatch"))
    assert not gpu.is_oom_error(ValueError("out of memory"))
