"""Hostile inputs at every boundary, each refused with its exact error type and message.

One table per boundary: recipes and overrides, run-directory files, trajectories, cache
files, CLI arguments and tool calls. Each case names the input, the exception type it must
raise (exactly, not a parent class) and a fragment of the message. No case trains a model.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import oracle_trajectory, record_of
from miniverl.errors import (
    CacheIntegrityError,
    CheckpointError,
    ConfigError,
    MiniverlError,
    RunDirectoryError,
    SchemaValidationError,
)

BOUND = "raise the constant in src/miniverl/config/limits.py"
NOT_A_KEY = "not a setting"


def _alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


# -- recipes ----------------------------------------------------------------------------

RECIPE_TEXT_CASES: list[tuple[str, str, str]] = [
    ("alias_bomb", _alias_bomb(), "alias bomb"),
    (
        "many_aliases",
        "a: &x 1\nb: [" + ",".join(["*x"] * 150) + "]\n",
        "more than 100 YAML aliases",
    ),
    ("recursive_alias", "a: &a [*a]\n", "recursive alias"),
    ("deep_flow_list", "train: " + "[" * 200 + "]" * 200 + "\n", "nested deeper than 64"),
    ("deep_flow_map", "train: " + "{a: " * 100 + "1" + "}" * 100 + "\n", "nested deeper than 64"),
    (
        "deep_block_map",
        "".join(f"{'  ' * i}k{i}:\n" for i in range(80)) + "  " * 80 + "x: 1\n",
        "nested deeper than 64",
    ),
    ("huge_int", "run:\n  seed: " + "9" * 5000 + "\n", "Exceeds the limit"),
    ("dup_top", "run: {seed: 1}\nrun: {seed: 2}\n", "duplicate key 'run'"),
    ("dup_nested", "train:\n  lr: 0.1\n  lr: 0.2\n", "duplicate key 'lr'"),
    ("python_object", "run: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
    ("python_name", "run: !!python/name:os.system\n", "not valid YAML"),
    ("not_mapping_list", "- a\n- b\n", "must be a mapping of sections, got list"),
    ("not_mapping_scalar", "42\n", "must be a mapping of sections, got int"),
    ("bad_yaml", "run: [unclosed\n", "not valid YAML"),
    ("tab_indent", "run:\n\tseed: 1\n", "not valid YAML"),
    ("unknown_section", "bogus: {}\n", "bogus: unknown key"),
    ("unknown_key", "train: {lr2: 0.1}\n", "train.lr2: unknown key"),
    ("lr_inf", "train: {lr: .inf}\n", "train.lr: Input should be a finite number"),
    ("lr_nan", "train: {lr: .nan}\n", "train.lr: Input should be a finite number"),
    ("lr_1e308", "train: {lr: 1.0e+308}\n", "train.lr: Input should be less than or equal to 1"),
    ("lr_negative", "train: {lr: -0.1}\n", "train.lr: Input should be greater than 0"),
    ("lr_string", "train: {lr: fast}\n", "train.lr: Input should be a valid number"),
    ("sft_lr_inf", "train: {sft_lr: .inf}\n", "train.sft_lr: Input should be a finite number"),
    ("toy_fit_lr_big", "models: {toy_fit: {lr: 5.0}}\n", "lab.toy_fit.lr: Input should be less"),
    ("beta_one", "train: {betas: [1.0, 0.5]}\n", "each beta must satisfy 0 <= beta < 1"),
    ("beta_nan", "train: {betas: [.nan, 0.9]}\n", "train.betas.0: Input should be a finite"),
    ("beta_negative", "train: {betas: [-0.1, 0.9]}\n", "each beta must satisfy"),
    (
        "weight_decay_inf",
        "train: {weight_decay: .inf}\n",
        "train.weight_decay: Input should be a finite",
    ),
    (
        "grad_norm_nan",
        "train: {max_grad_norm: .nan}\n",
        "train.max_grad_norm: Input should be a finite",
    ),
    ("cycles_huge", "train: {cycles: 1000000000}\n", BOUND),
    ("rollouts_huge", "train: {rollouts_per_cycle: 1000000}\n", BOUND),
    ("gas_huge", "train: {gradient_accumulation_steps: 100000}\n", "must be <= 4096"),
    ("warmup_cycles_huge", "train: {sft_warmup_cycles: 1000000000}\n", BOUND),
    ("replay_huge", "train: {replay_passes: 100000}\n", BOUND),
    ("train_tasks_1e9", "environment: {train_tasks: 1000000000}\n", BOUND),
    ("eval_tasks_1e9", "environment: {eval_tasks: 1000000000}\n", BOUND),
    ("test_tasks_1e9", "environment: {test_tasks: 1000000000}\n", BOUND),
    ("extra_tasks_1e9", "models: {toy_fit: {extra_tasks: 1000000000}}\n", BOUND),
    ("max_new_tokens_1e9", "rollout: {max_new_tokens_per_turn: 1000000000}\n", BOUND),
    ("max_total_tokens_1e9", "rollout: {max_total_tokens: 1000000000}\n", BOUND),
    ("max_turns_huge", "rollout: {max_turns: 100000}\n", BOUND),
    (
        "rollout_temp_inf",
        "rollout: {temperature: .inf}\n",
        "rollout.temperature: Input should be a finite",
    ),
    ("rollout_temp_huge", "rollout: {temperature: 1.0e+9}\n", BOUND),
    ("rollout_temp_negative", "rollout: {temperature: -1}\n", "greater than or equal to 0"),
    ("top_p_set", "rollout: {top_p: 0.9}\n", "rollout.top_p: not a setting (it is always 1.0)"),
    (
        "loss_temp_zero",
        "loss: {temperature: 0}\n",
        "loss.temperature: Input should be greater than 0",
    ),
    ("loss_temp_inf", "loss: {temperature: .inf}\n", "loss.temperature: Input should be a finite"),
    (
        "jsd_beta_two",
        "loss: {jsd_beta: 2}\n",
        "loss.jsd_beta: Input should be less than or equal to 1",
    ),
    ("top_k_huge", "loss: {top_k: 1000000000}\n", "loss.top_k must be <="),
    ("chunk_huge", "loss: {chunk_size: 1000000000}\n", "loss.chunk_size must be <="),
    ("nll_weight_inf", "loss: {sampled_token_nll_weight: .inf}\n", "Input should be a finite"),
    ("eval_temp_nan", "eval: {temperature: .nan}\n", "eval.temperature: Input should be a finite"),
    ("eval_max_tasks_huge", "eval: {max_tasks: 1000000000}\n", BOUND),
    ("eval_split_train", "eval: {split: train}\n", "eval.split: Input should be 'eval' or 'test'"),
    ("seed_negative", "run: {seed: -1}\n", "run.seed: Input should be greater than or equal to 0"),
    (
        "seed_2_64",
        "run: {seed: 18446744073709551616}\n",
        "run.seed: Input should be less than or equal",
    ),
    ("threads_huge", "run: {cpu_threads: 1000000}\n", "must be <= 4096"),
    ("name_escape", "run: {name: ../escaped}\n", "run.name: must be a single path component"),
    ("name_slash", "run: {name: a/b}\n", "run.name: must be a single path component"),
    ("name_backslash", 'run: {name: "a\\\\b"}\n', "run.name: must be a single path component"),
    ("name_nul", 'run: {name: "a\\0b"}\n', "run.name: must not contain NUL"),
    ("name_newline", 'run: {name: "a\\nb"}\n', "run.name: must not contain NUL or other control"),
    ("name_dotdot", "run: {name: ..}\n", "run.name: must not be '.' or '..'"),
    ("name_dot", "run: {name: .}\n", "run.name: must not be '.' or '..'"),
    ("name_hidden", "run: {name: .hidden}\n", "start with '.' or '-'"),
    ("name_dash", "run: {name: -rf}\n", "start with '.' or '-'"),
    ("name_long", "run: {name: " + "a" * 200 + "}\n", "run.name: String should have at most 128"),
    ("name_empty", 'run: {name: ""}\n', "run.name: String should have at least 1"),
    ("env_name_path", "environment: {name: os.path}\n", "environment.name: String should match"),
    ("hidden_huge", "models: {student: {model_id: x, toy: {hidden_size: 1000000}}}\n", NOT_A_KEY),
    (
        "seq_len_huge",
        "models: {student: {model_id: x, toy: {max_seq_len: 1000000000}}}\n",
        NOT_A_KEY,
    ),
    (
        "lora_alpha_inf",
        "models: {student: {model_id: x, lora: {alpha: .inf}}}\n",
        "Input should be a finite",
    ),
    ("shard_zero", "cache: {max_entries_per_shard: 0}\n", NOT_A_KEY),
    ("keep_versions_zero", "cache: {keep_versions: 0}\n", "greater than or equal to 1"),
    ("oom_retries_huge", "memory: {oom_retries: 1000}\n", NOT_A_KEY),
    ("headroom_inf", "memory: {auto_swap_vram_headroom_gb: .inf}\n", NOT_A_KEY),
    (
        "ratio_two",
        "selection: {ratio: 2}\n",
        "selection.ratio: Input should be less than or equal to 1",
    ),
    ("weights_inf", "selection: {critical_weight: .inf}\n", "Input should be a finite"),
    (
        "device_injection",
        "models: {device: 'cuda; rm -rf /'}\n",
        "models.device: String should match",
    ),
]


AMPLIFYING = frozenset(
    {"alias_bomb", "many_aliases", "recursive_alias", "deep_flow_list", "deep_flow_map"}
    | {"deep_block_map", "huge_int"}
)
"""Cases whose guard stands between a few hundred bytes and gigabytes or minutes of work:
they load in a capped child (:func:`_load_recipe_capped`)."""


@pytest.mark.parametrize(
    ("case", "text", "fragment"),
    [pytest.param(i, t, f, id=i) for i, t, f in RECIPE_TEXT_CASES],
)
def test_hostile_recipe_is_a_config_error(
    tmp_path: Path, case: str, text: str, fragment: str
) -> None:
    from miniverl.lab.config import LabRunConfig

    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    if case in AMPLIFYING:
        kind, message = _load_recipe_capped(path)
        assert kind == "ConfigError", message
    else:
        with pytest.raises(ConfigError) as info:
            LabRunConfig.from_yaml(path)
        assert type(info.value) is ConfigError
        message = info.value.message
    assert fragment in message, message
    assert str(path) in message


CAP_BYTES = 1 << 30
"""Address-space cap of the child that loads a hostile recipe (1 GiB; a guarded load needs
about a tenth of it, an unguarded alias bomb tens of GiB)."""
CAP_SECONDS = 30


_LOAD_RECIPE = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
resource.setrlimit(resource.RLIMIT_CPU, (int(sys.argv[3]), int(sys.argv[3])))
from miniverl.lab.config import LabRunConfig
from miniverl.errors import MiniverlError
try:
    LabRunConfig.from_yaml(sys.argv[1])
except MiniverlError as exc:
    print(json.dumps([type(exc).__name__, exc.message]))
else:
    print(json.dumps(["accepted", ""]))
"""


def _load_recipe_capped(path: Path) -> tuple[str, str]:
    """Load ``path`` in a child capped at :data:`CAP_BYTES` and :data:`CAP_SECONDS`.

    A hostile recipe whose guard regressed then fails this test in seconds (MemoryError,
    SIGXCPU or the timeout) instead of eating the machine: an unguarded alias bomb took
    minutes and ~10 GB in-process. Returns the error's type name and message.
    """
    import subprocess
    import sys

    from helpers import subprocess_env

    try:
        proc = subprocess.run(
            [sys.executable, "-c", _LOAD_RECIPE, str(path), str(CAP_BYTES), str(CAP_SECONDS)],
            capture_output=True,
            text=True,
            timeout=2 * CAP_SECONDS,
            env=subprocess_env(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {path} ran past {2 * CAP_SECONDS} s: its guard is gone")
    if proc.returncode != 0:
        pytest.fail(
            f"loading {path} died (exit {proc.returncode}) under a {CAP_BYTES >> 20} MiB / "
            f"{CAP_SECONDS} s cap: {proc.stderr.strip().splitlines()[-1:]}"
        )
    kind, message = json.loads(proc.stdout.strip().splitlines()[-1])
    return kind, message


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


RECIPE_FILE_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("fifo", lambda d: _fifo(d / "r.yaml"), "not a regular file"),
    ("directory", lambda d: (d / "r.yaml").mkdir() or d / "r.yaml", "not a regular file"),
    ("missing", lambda d: d / "absent.yaml", "recipe not found"),
    (
        "dangling_link",
        lambda d: (d / "r.yaml").symlink_to(d / "nowhere") or d / "r.yaml",
        "not found",
    ),
    (
        "not_utf8",
        lambda d: (d / "r.yaml").write_bytes(b"run: \xff\xfe\n") and d / "r.yaml",
        "not UTF-8",
    ),
    ("oversized", lambda d: (d / "r.yaml").write_bytes(b"#" * (2 << 20)) and d / "r.yaml", "limit"),
    ("dev_zero", lambda d: Path("/dev/zero"), "not a regular file"),
]


@pytest.mark.parametrize(
    ("make", "fragment"), [pytest.param(m, f, id=i) for i, m, f in RECIPE_FILE_CASES]
)
def test_hostile_recipe_file_is_refused_without_hanging(
    tmp_path: Path, make: Callable[[Path], Path], fragment: str
) -> None:
    from miniverl.config.models import RunConfig

    with pytest.raises(ConfigError) as info:
        RunConfig.from_yaml(make(tmp_path))
    assert type(info.value) is ConfigError
    assert fragment in info.value.message


OVERRIDE_CASES: list[tuple[str, str, str]] = [
    ("override_inf", "train.lr=.inf", "Input should be a finite number"),
    ("override_alias", "train.betas=&a [*a]", "recursive alias"),
    ("override_deep", "train.lr=" + "[" * 100 + "]" * 100, "nested deeper than 64"),
    ("override_no_equals", "train.lr", "is not of the form section.key=value"),
    ("override_bad_key", "train..lr=1", "must be dotted identifiers"),
    ("override_name_escape", "run.name=../../x", "run.name: must be a single path component"),
    ("override_huge_int", "run.seed=" + "9" * 5000, "Exceeds the limit"),
    ("override_python_tag", "run.name=!!python/name:os.system", "not valid YAML"),
    ("override_not_section", "train.lr.x=1", "train.lr is not a section"),
    ("override_nul", "run.name=a\x00b", "not valid YAML"),
    ("override_name_nul_escape", 'run.name="a\\0b"', "run.name: must not contain NUL"),
]


@pytest.mark.parametrize(
    ("override", "fragment"), [pytest.param(o, f, id=i) for i, o, f in OVERRIDE_CASES]
)
def test_hostile_override_is_a_config_error(override: str, fragment: str) -> None:
    from miniverl.config.models import RunConfig, apply_overrides

    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping(apply_overrides({"train": {"lr": 0.1}}, [override]))
    assert type(info.value) is ConfigError
    assert fragment in info.value.message, info.value.message


# -- run-directory JSON / JSONL / YAML ---------------------------------------------------

JSON_CASES: list[tuple[str, bytes, str]] = [
    ("garbage", b"\x00\xffgarbage{", "not UTF-8"),
    ("not_json", b"{not json", "is not valid JSON"),
    ("truncated", b'{"a": [1, 2', "is not valid JSON"),
    ("empty", b"", "is not valid JSON"),
    ("deep_array", b"[" * 100_000 + b"]" * 100_000, "nested deeper than 64"),
    ("deep_object", b'{"a":' * 5000 + b"1" + b"}" * 5000, "nested deeper than 64"),
    ("unclosed_deep", b"[" * 100_000, "nested deeper than 64"),
    ("array_top", b"[1, 2, 3]", "holds a JSON list, expected a JSON object"),
    ("string_top", b'"hello"', "holds a JSON str, expected a JSON object"),
    ("null_top", b"null", "holds a JSON NoneType"),
    ("duplicate_keys", b'{"a": 1, "a": 2}', "duplicate key 'a'"),
    ("trailing_garbage", b'{"a": 1} xyz', "is not valid JSON"),
    ("bom_then_json", b"\xef\xbb\xbf{}", "is not valid JSON"),
]


@pytest.mark.parametrize(("data", "fragment"), [pytest.param(d, f, id=i) for i, d, f in JSON_CASES])
def test_hostile_run_dir_json_is_a_run_directory_error(
    tmp_path: Path, data: bytes, fragment: str
) -> None:
    from miniverl.utils.io import read_json

    path = tmp_path / "eval.json"
    path.write_bytes(data)
    with pytest.raises(RunDirectoryError) as info:
        read_json(path)
    assert type(info.value) is RunDirectoryError
    assert fragment in info.value.message and str(path) in info.value.message


def test_json_larger_than_its_limit_is_refused(tmp_path: Path) -> None:
    from miniverl.utils.safe_load import load_json_file

    path = tmp_path / "manifest.json"
    path.write_bytes(b'{"a": "' + b"x" * 2048 + b'"}')
    with pytest.raises(RunDirectoryError, match="over the 1024-byte limit"):
        load_json_file(path, max_bytes=1024)


def test_fifo_json_is_refused_without_hanging(tmp_path: Path) -> None:
    from miniverl.utils.io import read_json

    with pytest.raises(RunDirectoryError, match="not a regular file"):
        read_json(_fifo(tmp_path / "manifest.json"))


JSONL_CASES: list[tuple[str, bytes, str]] = [
    ("garbage_line", b'{"kind": "step"}\nnot json\n{"kind": "step"}\n', ":2 is not valid JSON"),
    ("array_line", b'{"kind": "step"}\n[1, 2]\n', ":2 is a JSON list, expected a JSON object"),
    ("deep_line", b"[" * 5000 + b"]" * 5000 + b"\n", ":1 is nested deeper than 64"),
    ("binary_line", b'{"a": 1}\n\xff\xfe\n{"b": 2}\n', ":2 is not UTF-8"),
    ("dup_key_line", b'{"a": 1, "a": 1}\n', "duplicate key 'a'"),
]


@pytest.mark.parametrize(
    ("data", "fragment"), [pytest.param(d, f, id=i) for i, d, f in JSONL_CASES]
)
def test_hostile_metrics_jsonl_is_a_run_directory_error(
    tmp_path: Path, data: bytes, fragment: str
) -> None:
    from miniverl.inspection.run_dir import read_jsonl

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(data)
    with pytest.raises(RunDirectoryError) as info:
        read_jsonl(path)
    assert type(info.value) is RunDirectoryError
    assert fragment in info.value.message and str(path) in info.value.message


def test_torn_final_jsonl_line_is_ignored_by_readers_and_cut_on_repair(tmp_path: Path) -> None:
    from miniverl.inspection.run_dir import read_jsonl
    from miniverl.utils.io import repair_jsonl_tail

    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": ')
    assert read_jsonl(path) == [{"a": 1}, {"b": 2}]
    assert repair_jsonl_tail(path) == len(b'{"c": ')
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    assert repair_jsonl_tail(path) == 0


RESOLVED_YAML_CASES: list[tuple[str, str, str]] = [
    ("garbage", "run: [unclosed\n", "is not valid YAML"),
    ("list", "- a\n- b\n", "is not a mapping of config sections"),
    ("alias_bomb", _alias_bomb(), "alias bomb"),
    ("unknown_key", "run: {nope: 1}\n", "run.nope: unknown key"),
    ("deep", "a: " + "[" * 100 + "]" * 100 + "\n", "nested deeper than 64"),
    ("dup", "run: {}\nrun: {}\n", "duplicate key 'run'"),
]


@pytest.mark.parametrize(
    ("text", "fragment"), [pytest.param(t, f, id=i) for i, t, f in RESOLVED_YAML_CASES]
)
def test_hostile_config_resolved_is_a_run_directory_error(
    tmp_path: Path, text: str, fragment: str
) -> None:
    from miniverl.config.loading import load_resolved_config

    (tmp_path / "config.resolved.yaml").write_text(text)
    with pytest.raises(RunDirectoryError) as info:
        load_resolved_config(tmp_path)
    assert type(info.value) is RunDirectoryError
    assert fragment in info.value.message and "config.resolved.yaml" in info.value.message


# -- checkpoints --------------------------------------------------------------------------


def _checkpoint(tmp_path: Path, **tensors: Any) -> Path:
    import torch

    from miniverl.training.checkpoint import save_checkpoint

    weights = tensors.get("weights", {"w": torch.ones(2, 2)})
    return save_checkpoint(
        tmp_path / "checkpoints" / "cycle-0000",
        trainable=weights,
        optimizer_tensors=tensors.get("optimizer", {"0.exp_avg": torch.zeros(2, 2)}),
        state={
            "cycle": 0,
            "global_step": 1,
            "parameter_version": 1,
            "task_cursor": 0,
            "chunk_size": 8,
            "rng": {"python": [3, [1] * 624 + [624], None]},
            "optimizer": {},
        },
        config_digest="d" * 64,
    )


def _rehash(path: Path) -> None:
    from miniverl.training.checkpoint import MARKER_FILE
    from miniverl.utils.hashing import sha256_file

    marker = json.loads((path / MARKER_FILE).read_text())
    marker["files"] = {name: sha256_file(path / name) for name in marker["files"]}
    (path / MARKER_FILE).write_text(json.dumps(marker))


def _nan_weights(tmp_path: Path) -> Path:
    import torch

    return _checkpoint(tmp_path, weights={"w": torch.tensor([[1.0, float("nan")], [0.0, 1.0]])})


def _inf_moments(tmp_path: Path) -> Path:
    import torch

    return _checkpoint(tmp_path, optimizer={"0.exp_avg": torch.full((2, 2), float("inf"))})


def _marker_garbage(tmp_path: Path) -> Path:
    path = _checkpoint(tmp_path)
    (path / "checkpoint.json").write_bytes(b"\x00garbage")
    return path


def _marker_deep(tmp_path: Path) -> Path:
    path = _checkpoint(tmp_path)
    (path / "checkpoint.json").write_bytes(b"[" * 50_000)
    return path


def _marker_list(tmp_path: Path) -> Path:
    path = _checkpoint(tmp_path)
    (path / "checkpoint.json").write_text("[1]")
    return path


def _state_rehashed_missing_keys(tmp_path: Path) -> Path:
    path = _checkpoint(tmp_path)
    (path / "state.json").write_text(json.dumps({"config_digest": "d" * 64}))
    _rehash(path)
    return path


def _state_rehashed_garbage(tmp_path: Path) -> Path:
    path = _checkpoint(tmp_path)
    (path / "state.json").write_bytes(b"{{{")
    _rehash(path)
    return path


def _state_rehashed(tmp_path: Path, **fields: Any) -> Path:
    path = _checkpoint(tmp_path)
    state = json.loads((path / "state.json").read_text())
    (path / "state.json").write_text(json.dumps({**state, **fields}))
    _rehash(path)
    return path


def _state_rng_short(tmp_path: Path) -> Path:
    return _state_rehashed(tmp_path, rng={"python": [3, [1, 2, 3], None, 7]})


def _state_rng_words(tmp_path: Path) -> Path:
    return _state_rehashed(tmp_path, rng={"python": [3, [-1] * 625, None]})


def _state_rng_torch(tmp_path: Path) -> Path:
    return _state_rehashed(
        tmp_path, rng={"python": [3, [1] * 624 + [624], None], "torch_cpu": [300]}
    )


def _state_rng_missing(tmp_path: Path) -> Path:
    return _state_rehashed(tmp_path, rng={})


def _state_huge_cycle(tmp_path: Path) -> Path:
    return _state_rehashed(tmp_path, cycle=10**12)


def _adapter_rehashed_garbage(tmp_path: Path) -> Path:
    path = _checkpoint(tmp_path)
    (path / "adapter.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{")
    _rehash(path)
    return path


def _adapter_fifo(tmp_path: Path) -> Path:
    path = _checkpoint(tmp_path)
    (path / "adapter.safetensors").unlink()
    _fifo(path / "adapter.safetensors")
    return path


def _adapter_tampered(tmp_path: Path) -> Path:
    path = _checkpoint(tmp_path)
    with open(path / "adapter.safetensors", "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x01")
    return path


CHECKPOINT_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("nan_weights", _nan_weights, "adapter.safetensors holds non-finite values"),
    ("inf_moments", _inf_moments, "optimizer.safetensors holds non-finite values"),
    ("marker_garbage", _marker_garbage, "checkpoint.json is not valid JSON"),
    ("marker_deep", _marker_deep, "checkpoint.json is nested deeper"),
    ("marker_list", _marker_list, "checkpoint.json holds a JSON list"),
    ("state_missing_keys", _state_rehashed_missing_keys, "state.json lacks"),
    ("state_garbage", _state_rehashed_garbage, "state.json is not valid JSON"),
    ("state_rng_short", _state_rng_short, "state.json: field 'rng': rng.python must be"),
    ("state_rng_words", _state_rng_words, "field 'rng': rng.python state words"),
    ("state_rng_torch", _state_rng_torch, "field 'rng': rng.torch_cpu must hold"),
    ("state_rng_missing", _state_rng_missing, "field 'rng': rng.python is missing"),
    ("state_huge_cycle", _state_huge_cycle, "state.json: field 'cycle'"),
    ("adapter_garbage", _adapter_rehashed_garbage, "adapter.safetensors"),
    ("adapter_fifo", _adapter_fifo, "adapter.safetensors is not a regular file"),
    ("adapter_tampered", _adapter_tampered, "does not match its SHA-256"),
]


@pytest.mark.parametrize(
    ("make", "fragment"), [pytest.param(m, f, id=i) for i, m, f in CHECKPOINT_CASES]
)
def test_hostile_checkpoint_is_a_checkpoint_error(
    tmp_path: Path, make: Callable[[Path], Path], fragment: str
) -> None:
    from miniverl.training.checkpoint import load_checkpoint

    path = make(tmp_path)
    before = _snapshot(tmp_path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert type(info.value) is CheckpointError
    assert fragment in info.value.message, info.value.message
    assert _snapshot(tmp_path) == before, "a refused checkpoint changed files on disk"


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_fifo()
    }


def test_state_cycle_past_the_recipe_is_a_checkpoint_error() -> None:
    """``cycle`` 5 passes the schema's sanity bound but not a recipe with ``train.cycles: 2``."""
    from miniverl.schemas.records import check_state_cycle

    check_state_cycle({"cycle": 1}, "state.json", cycles=2)
    check_state_cycle({"cycle": -1}, "state.json", cycles=2)
    for bad in (2, 5, 10**12, -2, "1", None):
        with pytest.raises(CheckpointError, match=r"state.json: field 'cycle'"):
            check_state_cycle({"cycle": bad}, "state.json", cycles=2)


def test_restoring_a_garbage_rng_block_is_a_value_error_naming_the_part() -> None:
    import random

    from miniverl.utils.seeding import restore_rng_state

    before = random.getstate()
    with pytest.raises(ValueError, match=r"rng\.python must be"):
        restore_rng_state({"python": [3, [1, 2], None, 9]})
    assert random.getstate() == before


def test_optimizer_state_without_exp_avg_is_a_checkpoint_error() -> None:
    import torch

    from miniverl.training.optim import load_optimizer_state

    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([param])
    meta = {
        "num_params": 1,
        "scalars": {"0.step": 1.0},
        "param_groups": optimizer.state_dict()["param_groups"],
    }
    with pytest.raises(CheckpointError, match="lacks exp_avg"):
        load_optimizer_state(optimizer, {"0.exp_avg_sq": torch.zeros(2)}, meta)


# -- trajectories --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trajectory_record() -> dict[str, Any]:
    return record_of(oracle_trajectory())


def _mutate(record: dict[str, Any], how: str) -> str:
    rec = json.loads(json.dumps(record))
    if how == "vocab":
        rec["token_ids"][-1] = 10**6
    elif how == "huge_id":
        rec["token_ids"][-1] = 10**12
    elif how == "negative":
        rec["token_ids"][0] = -1
    elif how == "version":
        rec["schema_version"] = 999
    elif how == "length":
        rec["token_ids"] = rec["token_ids"][:-1]
    elif how == "unknown_field":
        rec["evil"] = 1
    elif how == "missing_field":
        del rec["token_ids"]
    elif how == "float_token":
        rec["token_ids"][0] = 1.5
    elif how == "string_tokens":
        rec["token_ids"] = "abc"
    elif how == "deep":
        return '{"a": ' + "[" * 5000 + "]" * 5000 + "}"
    elif how == "dup":
        return json.dumps(rec)[:-1] + ', "trajectory_id": "x"}'
    elif how == "array":
        return "[1, 2]"
    elif how == "garbage":
        return "\x00not json"
    return json.dumps(rec)


TRAJECTORY_CASES: list[tuple[str, str]] = [
    ("vocab", "outside the tokenizer vocabulary"),
    ("huge_id", "token id 1000000000000 is past 16777215"),
    ("negative", "token ids must be non-negative"),
    ("version", "has trajectory schema_version 999"),
    ("length", "but token_ids has length"),
    ("unknown_field", "evil"),
    ("missing_field", "token_ids"),
    ("float_token", "token_ids.0"),
    ("string_tokens", "token_ids"),
    ("deep", "nested deeper than 64"),
    ("dup", "duplicate key 'trajectory_id'"),
    ("array", "is not a JSON object"),
    ("garbage", "is not valid JSON"),
]


@pytest.mark.parametrize(
    ("how", "fragment"), TRAJECTORY_CASES, ids=[c[0] for c in TRAJECTORY_CASES]
)
def test_hostile_trajectory_line_is_a_schema_error(
    tmp_path: Path, trajectory_record: dict[str, Any], how: str, fragment: str
) -> None:
    from miniverl.trajectory.io import read_trajectories

    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(trajectory_record) + "\n" + _mutate(trajectory_record, how) + "\n")
    with pytest.raises(SchemaValidationError) as info:
        read_trajectories(path, vocab_size=200)
    assert type(info.value) is SchemaValidationError
    assert fragment in info.value.message, info.value.message
    assert f"{path}:2" in info.value.message


def test_inspect_checks_token_ids_against_the_run_manifest(
    tmp_path: Path, trajectory_record: dict[str, Any]
) -> None:
    from miniverl.inspection.summary import summarize_file

    path = tmp_path / "trajectories.jsonl"
    path.write_text(_mutate(trajectory_record, "vocab") + "\n")
    summarize_file(path)  # no manifest: only the sanity bound, which 10**6 is under
    (tmp_path / "manifest.json").write_text(json.dumps({"tokenizer": {"vocab_size": 200}}))
    with pytest.raises(SchemaValidationError, match="outside the tokenizer vocabulary"):
        summarize_file(path)


def test_inspect_of_a_standalone_file_refuses_an_id_past_any_vocabulary(
    tmp_path: Path, trajectory_record: dict[str, Any]
) -> None:
    from miniverl.inspection.summary import summarize_file

    path = tmp_path / "trajectories.jsonl"
    path.write_text(_mutate(trajectory_record, "huge_id") + "\n")
    with pytest.raises(SchemaValidationError, match=f"{path}:1.*beyond any tokenizer"):
        summarize_file(path)


def test_fifo_trajectory_file_is_refused_without_hanging(tmp_path: Path) -> None:
    from miniverl.trajectory.io import read_trajectories

    with pytest.raises(SchemaValidationError, match="not a regular file"):
        read_trajectories(_fifo(tmp_path / "t.jsonl"))


# -- cache files ----------------------------------------------------------------------------


CACHE_INDEX_CASES: list[tuple[str, bytes, str]] = [
    ("deep", b"[" * 100_000, "nested deeper than 64"),
    ("dup", b'{"a": 1, "a": 2}', "duplicate key 'a'"),
    ("garbage", b"\xff\x00", "not valid UTF-8 JSON"),
    ("list", b"[]", "is not a valid cache index"),
]


@pytest.mark.parametrize(
    ("data", "fragment"), [pytest.param(d, f, id=i) for i, d, f in CACHE_INDEX_CASES]
)
def test_hostile_cache_index_is_a_cache_integrity_error(
    tmp_path: Path, data: bytes, fragment: str
) -> None:
    from miniverl.cache.store import TeacherCache

    (tmp_path / "index.json").write_bytes(data)
    with pytest.raises(CacheIntegrityError) as info:
        TeacherCache.open(tmp_path)
    assert type(info.value) is CacheIntegrityError
    assert fragment in info.value.message, info.value.message


def test_fifo_cache_index_is_refused_without_hanging(tmp_path: Path) -> None:
    from miniverl.cache.store import TeacherCache

    _fifo(tmp_path / "index.json")
    with pytest.raises(CacheIntegrityError, match="not a regular file"):
        TeacherCache.open(tmp_path)


# -- tool calls -----------------------------------------------------------------------------

TOOL_TEXT_CASES: list[tuple[str, str, str]] = [
    (
        "deep_args",
        '{"name": "calculator", "arguments": ' + "[" * 50 + "]" * 50 + "}",
        "nested too deeply",
    ),
    ("very_deep", "[" * 100_000, "too long"),
    ("deep_short", "[" * 2000 + "]" * 2000, "nested too deeply"),
    ("not_json", "{name: calculator}", "not valid JSON"),
    ("array", "[1, 2]", "must be a JSON object"),
    ("no_name", '{"arguments": {}}', 'needs a string "name"'),
    ("name_number", '{"name": 5}', 'needs a string "name"'),
    ("args_list", '{"name": "calculator", "arguments": [1]}', '"arguments" must be a JSON object'),
    ("extra_keys", '{"name": "calculator", "arguments": {}, "x": 1}', "unexpected keys"),
    ("nan_constant", '{"name": "calculator", "arguments": {"expression": NaN}}', None),
]


@pytest.mark.parametrize(
    ("body", "fragment"), [pytest.param(b, f, id=i) for i, b, f in TOOL_TEXT_CASES]
)
def test_hostile_tool_call_text_is_a_parse_error_not_an_exception(
    body: str, fragment: str | None
) -> None:
    from miniverl.agent.protocol import parse_assistant_text

    parsed = parse_assistant_text(f"<tool_call>{body}</tool_call>")
    if fragment is None:  # parsed, and the calculator refuses the non-string argument
        assert parsed.kind in ("tool_call", "error")
        return
    assert parsed.kind == "error"
    assert fragment in (parsed.error or ""), parsed.error


CALCULATOR_CASES: list[tuple[str, str]] = [
    ("1e-300**-64", "exceeds"),
    ("0.1**-64", "exceeds"),
    ("1e308*10", "exceeds"),
    ("10.0**30*10", "exceeds"),
    ("9**9**9", "too large"),
    ("2**1000", "too large"),
    ("(10**18)*(10**18)", "exceeds"),
    ("1/0", "division by zero"),
    ("1//0", "division by zero"),
    ("1%0", "division by zero"),
    ("0**-1", "division by zero"),
    ("7//0.0", "division by zero"),
    ("(-8)**0.5", "integer exponents"),
    ("2**0.5", "integer exponents"),
    ("1" * 30, "too long"),
    ("(" * 40 + "1" + ")" * 40, "nested too deeply"),
    ("__import__('os')", "unsupported syntax"),
    ("abs(-1)", "unsupported syntax"),
    ("x", "unsupported syntax"),
    ("'a'*9", "unsupported syntax"),
    ("1 if 1 else 2", "unsupported syntax"),
    ("[1]*9", "unsupported syntax"),
    ("1 < 2", "unsupported syntax"),
    ("lambda: 1", "unsupported syntax"),
    ("1+" * 100 + "1", "too long"),
    ("", "empty"),
    ("   ", "empty"),
    ("1 +", "could not parse"),
    ("1e400", "not a finite number"),
    ("9" * 18 + "*" + "9" * 18, "exceeds"),
]


@pytest.mark.parametrize(("expression", "fragment"), CALCULATOR_CASES)
def test_hostile_calculator_expression_is_a_tool_error(expression: str, fragment: str) -> None:
    from helpers import calculator
    from miniverl.environments.base import ToolCall

    env = calculator()
    result = env.step(ToolCall(name="calculator", arguments={"expression": expression}))
    assert result.ok is False
    assert fragment in (result.error or ""), result.error


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"expression": 5}, "missing string argument"),
        ({"expression": None}, "missing string argument"),
        ({}, "missing string argument"),
        ({"expression": "1", "x": 1}, "unexpected argument"),
    ],
)
def test_hostile_calculator_arguments_are_tool_errors(
    arguments: dict[str, Any], fragment: str
) -> None:
    from helpers import calculator
    from miniverl.environments.base import ToolCall

    result = calculator().step(ToolCall(name="calculator", arguments=arguments))
    assert result.ok is False and fragment in (result.error or "")


def test_every_error_here_is_a_miniverl_error() -> None:
    for cls in (
        CacheIntegrityError,
        CheckpointError,
        ConfigError,
        RunDirectoryError,
        SchemaValidationError,
    ):
        assert issubclass(cls, MiniverlError)


@pytest.mark.parametrize(
    ("tensor", "value"),
    [
        ("topk_log_probs", float("nan")),
        ("tail_log_prob", float("inf")),
        ("teacher_entropy", float("nan")),
    ],
)
def test_non_finite_cached_targets_are_refused_on_read(
    tmp_path: Path, tensor: str, value: float
) -> None:
    import hashlib

    import torch

    from miniverl.cache.store import TeacherCache
    from miniverl.schemas.cache import CacheProvenance

    provenance = CacheProvenance(
        teacher_model_id="teacher",
        tokenizer_fingerprint="a" * 64,
        top_k=2,
        temperature=1.0,
        vocab_size=10,
    )
    log_probs = torch.log_softmax(
        torch.randn(3, 10, generator=torch.Generator().manual_seed(0)), -1
    )
    top = torch.topk(log_probs, 2, dim=-1)
    tensors = {
        "topk_indices": top.indices,
        "topk_log_probs": top.values.clone(),
        "tail_log_prob": torch.log1p(-top.values.exp().sum(-1)),
        "teacher_entropy": -(log_probs.exp() * log_probs).sum(-1),
    }
    tensors[tensor].view(-1)[0] = value
    cache = TeacherCache(tmp_path, provenance)
    digest = hashlib.sha256(b"k").hexdigest()
    cache.write("k", tensors, trajectory_id="k", policy_version=0, alignment_digest=digest)
    cache.flush()
    with pytest.raises(CacheIntegrityError, match=f"tensor 'k/{tensor}' holds NaN or \\+inf"):
        TeacherCache.open(tmp_path).read("k", expect_policy_version=0)
