"""``run.cpu_threads: auto`` and ``models.rollout_dtype: auto`` decide from an injected decode
probe (training/resolve.py), write the decision and its reason into ``config.resolved.yaml``,
and a bf16 rollout copy (models/hf.py ``RolloutCopy``) follows every update of the model.

Nothing here is timed: the probes are built by hand, and the real probe is only checked for
its shape (every arm measured, torch's thread count restored).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from helpers import tiny_config  # noqa: E402
from miniverl.errors import ConfigError  # noqa: E402
from miniverl.models.base import BackendCapabilities  # noqa: E402
from miniverl.models.probe import DecodeProbe, decode_matmul_shapes, probe_decode_step  # noqa: E402
from miniverl.training.resolve import (  # noqa: E402
    HostCapabilities,
    needs_decode_probe,
    resolve_cpu_threads,
    resolve_rollout_dtype,
    resolve_run,
)


def _hf(*overrides: str):
    return tiny_config(
        "models.backend=hf",
        "models.device=cpu",
        "models.student.model_id=some/student",
        "models.teacher.model_id=some/teacher",
        *overrides,
    )


def _probe(**seconds: float) -> DecodeProbe:
    """``t1_float32=0.010`` -> ``{(1, "float32"): 0.010}``."""
    table = {}
    for key, value in seconds.items():
        threads, dtype = key.split("_")
        table[(int(threads[1:]), dtype)] = value
    return DecodeProbe(table, rows=4, shape="[4, in] x 1x[8, 8]")


def _caps() -> BackendCapabilities:
    return BackendCapabilities(
        backend="hf",
        model_id="m",
        revision=None,
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_parameters=1000,
        num_trainable_parameters=1000,
        precision="float32",
        quantization="none",
        lora=False,
        kv_cache=True,
        can_offload=True,
        device="cpu",
    )


@pytest.mark.parametrize(
    ("one", "two", "expected"),
    [(0.010, 0.005, 2), (0.010, 0.0086, 2), (0.010, 0.0088, 1), (0.010, 0.020, 1)],
    ids=["2x-faster", "just-enough", "just-short", "slower"],
)
def test_threads_follow_the_probe(one: float, two: float, expected: int) -> None:
    threads, reason = resolve_cpu_threads(
        _hf(), device="cpu", torch_threads=2, probe=_probe(t1_float32=one, t2_float32=two)
    )
    assert threads == expected
    assert f"auto -> {expected}" in reason and "10.00 ms" in reason


def test_threads_without_probe_or_on_the_toy_or_explicit() -> None:
    assert resolve_cpu_threads(_hf(), device="cpu", torch_threads=4)[0] == 4
    toy, reason = resolve_cpu_threads(
        tiny_config(), device="cpu", torch_threads=4, probe=_probe(t1_float32=1.0, t4_float32=0.1)
    )
    assert toy == 1 and "toy" in reason
    fixed, reason = resolve_cpu_threads(_hf("run.cpu_threads=3"), device="cpu", torch_threads=4)
    assert fixed == 3 and "set by run.cpu_threads" in reason
    assert resolve_cpu_threads(_hf(), device="cuda", torch_threads=4)[0] == 4


@pytest.mark.parametrize(
    ("f32", "bf16", "expected"),
    [(0.010, 0.005, "bfloat16"), (0.010, 0.0096, "model"), (0.010, 0.030, "model")],
    ids=["bf16-faster", "bf16-marginal", "bf16-slower"],
)
def test_rollout_dtype_follows_the_probe(f32: float, bf16: float, expected: str) -> None:
    probe = _probe(t1_float32=f32, t1_bfloat16=bf16)
    dtype, reason = resolve_rollout_dtype(_hf(), device="cpu", threads=1, probe=probe)
    assert dtype == expected
    assert ("auto -> bfloat16" if expected == "bfloat16" else "auto -> float32") in reason


def test_rollout_dtype_applies_only_to_an_hf_float32_student_on_the_cpu() -> None:
    fast_bf16 = _probe(t1_float32=1.0, t1_bfloat16=0.1)
    assert resolve_rollout_dtype(_hf(), device="cpu", threads=1, probe=fast_bf16)[0] == "bfloat16"
    cuda = resolve_rollout_dtype(_hf(), device="cuda", threads=1, probe=fast_bf16)
    assert cuda[0] == "model"
    bf16_model = _hf("models.student.precision=bfloat16")
    assert resolve_rollout_dtype(bf16_model, device="cpu", threads=1, probe=fast_bf16)[0] == "model"
    toy = resolve_rollout_dtype(tiny_config(), device="cpu", threads=1, probe=fast_bf16)
    assert toy[0] == "model"
    forced = _hf("models.rollout_dtype=bfloat16")
    assert resolve_rollout_dtype(forced, device="cpu", threads=1)[0] == "bfloat16"
    assert not needs_decode_probe(tiny_config(), device="cpu")
    assert needs_decode_probe(_hf(), device="cpu")
    assert not needs_decode_probe(
        _hf("run.cpu_threads=1", "models.rollout_dtype=float32"), device="cpu"
    )


def test_bf16_rollouts_refuse_the_toy_and_a_shared_backbone() -> None:
    with pytest.raises(ConfigError, match="rollout_dtype: bfloat16"):
        tiny_config("models.rollout_dtype=bfloat16")


def test_resolved_yaml_records_both_decisions_and_why() -> None:
    config = _hf()
    host = HostCapabilities(
        cuda_available=False,
        torch_threads=2,
        decode_probe=_probe(
            t1_float32=0.010, t2_float32=0.004, t2_bfloat16=0.002, t1_bfloat16=0.003
        ),
    )
    resolved = resolve_run(config, device="cpu", host=host, student=_caps(), teacher=_caps())
    assert (resolved.cpu_threads, resolved.rollout_dtype) == (2, "bfloat16")
    text = resolved.resolved_yaml(config)
    assert "# cpu threads: auto -> 2: the decode-step probe" in text
    assert "# rollout dtype: auto -> bfloat16" in text
    again = resolved.to_config(config)
    assert again.run.cpu_threads == 2 and again.models.rollout_dtype == "bfloat16"


def test_the_probe_times_every_arm_at_the_model_shapes() -> None:
    module = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), torch.nn.Linear(16, 32)
    )
    assert decode_matmul_shapes(module) == {(32, 16): 2, (16, 32): 1}
    before = torch.get_num_threads()
    probe = probe_decode_step(
        module,
        rows=3,
        thread_counts=[1, 2],
        dtypes=("float32", "bfloat16"),
        budget_s=0.01,
        rounds=2,
    )
    assert torch.get_num_threads() == before
    assert set(probe.seconds) == {(1, "float32"), (2, "float32"), (1, "bfloat16"), (2, "bfloat16")}
    assert all(s > 0 for s in probe.seconds.values())
    assert probe.shape.startswith("[3, in]") and "2x[32, 16]" in probe.shape


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from miniverl.models.tiny_hf import build_tiny_hf_checkpoint

    return build_tiny_hf_checkpoint(tmp_path_factory.mktemp("tiny"), arch="qwen3", seed=0)


def test_bf16_rollout_copy_follows_every_update(tiny_dir: Path) -> None:
    from miniverl.models.hf import HFBackend

    backend = HFBackend(tiny_dir, precision="float32", lora={"enabled": True, "r": 4})
    prompt = backend.tokenizer.encode("Compute 2 + 3.")
    backend.set_rollout_dtype("bfloat16")
    backend.generate_batch([prompt], max_new_tokens=[3], seeds=[0], temperature=0.0)
    copy = backend._rollout_copy._copy
    assert next(copy.parameters()).dtype == torch.bfloat16
    name, param = next((n, p) for n, p in backend._base.named_parameters() if p.requires_grad)
    with torch.no_grad():
        param.add_(0.5)
    backend.generate_batch([prompt], max_new_tokens=[3], seeds=[0], temperature=0.0)
    copied = dict(backend._rollout_copy._copy.named_parameters())[name]
    assert torch.equal(copied, param.detach().to(torch.bfloat16))
    assert backend._backbone is backend._base.get_decoder()
    assert all(p.dtype == torch.float32 for p in backend.model.parameters())
    backend.set_rollout_dtype("model")
    assert backend._rollout_copy is None
