"""HFBackend on CPU with tiny random checkpoints built offline by ``build_tiny_hf_checkpoint``.

The checkpoints are loaded through the same ``from_pretrained`` path a real Qwen3 or Llama
checkpoint takes. GPU tests (bf16, NF4) are marked ``gpu`` and skip without CUDA.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from safetensors.torch import load_file, save_file  # noqa: E402

from miniverl.errors import BackendError, CheckpointError, ConfigError, TokenizerMismatchError  # noqa: E402
from miniverl.models.base import CausalLMBackend, PaddedTrajectoryBatch  # noqa: E402
from miniverl.models.hf import HFBackend, LoraSettings  # noqa: E402
from miniverl.models.hf_shared import HFRoleView, build_shared_backbone  # noqa: E402
from miniverl.models.sampling import recompute_step, run_generation  # noqa: E402
from miniverl.models.tiny_hf import PROTOCOL_TAGS, build_tiny_hf_checkpoint  # noqa: E402
from miniverl.models.tokenizers import HFTokenizerAdapter, check_same_tokenizer, load_hf_tokenizer  # noqa: E402
from miniverl.schemas.text import TokenizerLike  # noqa: E402

PROMPT_TEXT = "<|im_start|>user\nCompute 12 * (7 - 3) and report the value.<|im_end|>\n<|im_start|>assistant\n"
CUDA = torch.cuda.is_available()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_hf_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"), arch="qwen3", seed=0)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_hf_checkpoint(tmp_path_factory.mktemp("tiny-llama"), arch="llama", seed=1)


@pytest.fixture(scope="module")
def qwen(qwen_dir: Path) -> HFBackend:
    return HFBackend(qwen_dir)


def prompt_ids(backend: HFBackend) -> list[int]:
    return backend.tokenizer.encode(PROMPT_TEXT)


def reference_logits(backend: HFBackend, ids: list[int]) -> torch.Tensor:
    """``model(input_ids).logits``: the plain full forward a user would write."""
    with torch.no_grad():
        return backend.model(input_ids=torch.tensor([ids], device=backend.device)).logits[0]


class _StubTokenizer:
    vocab_size, eos_token_id, pad_token_id, fingerprint = 10, 0, 0, "stub"

    def encode(self, text: str) -> list[int]:
        return []

    def decode(self, ids: list[int]) -> str:
        return ""


# ------------------------------------------------------------------------------ tokenizers


def test_tiny_tokenizer_adapter(qwen_dir: Path) -> None:
    tok = load_hf_tokenizer(qwen_dir)
    assert isinstance(tok, HFTokenizerAdapter) and isinstance(tok, TokenizerLike)
    assert tok.vocab_size == len(tok.hf_tokenizer) == 512
    assert tok.eos_token_id == tok.pad_token_id == tok.token_to_id("<|endoftext|>")
    for tag in ("<|im_start|>", "<|im_end|>", *PROTOCOL_TAGS):
        assert tok.encode(tag) == [tok.token_to_id(tag)]
    text = PROMPT_TEXT + '<tool_call>\n{"name": "calculator"}\n</tool_call> naïve 😀'
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_start|>")[0] not in tok.encode("x")  # no BOS/EOS added
    assert len(tok.fingerprint) == 64 and tok.fingerprint == load_hf_tokenizer(qwen_dir).fingerprint


def test_checkpoint_is_deterministic(tmp_path: Path, qwen_dir: Path) -> None:
    again = build_tiny_hf_checkpoint(tmp_path / "again", arch="qwen3", seed=0)
    for name in ("tokenizer.json", "config.json", "model.safetensors"):
        assert (again / name).read_bytes() == (qwen_dir / name).read_bytes()


def test_tokenizer_mismatch_raises(qwen_dir: Path, llama_dir: Path) -> None:
    student, teacher = load_hf_tokenizer(qwen_dir), load_hf_tokenizer(llama_dir)
    assert student.fingerprint != teacher.fingerprint
    with pytest.raises(
        TokenizerMismatchError, match="miniVERL currently supports same-tokenizer distillation only"
    ):
        check_same_tokenizer(student, teacher)
    check_same_tokenizer(student, load_hf_tokenizer(qwen_dir))


def test_missing_model_offline_is_a_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BackendError, match="offline") as info:
        load_hf_tokenizer("miniverl-test/definitely-not-cached")
    assert "local directory" in info.value.hint
    with pytest.raises(BackendError, match="offline"):
        HFBackend("miniverl-test/definitely-not-cached", tokenizer=_StubTokenizer())


# ---------------------------------------------------------------------------- forward paths


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_hidden_states_then_project_equals_model_logits(
    arch: str, qwen: HFBackend, llama_dir: Path
) -> None:
    backend = qwen if arch == "qwen3" else HFBackend(llama_dir)
    assert isinstance(backend, CausalLMBackend)
    ids = prompt_ids(backend) + backend.tokenizer.encode('<tool_call>\n{"name"')
    positions = [0, 4, len(ids) - 2, len(ids) - 1]
    hidden = backend.hidden_states_at(ids, positions)
    cfg = backend.capabilities
    assert hidden.shape == (len(positions), cfg.hidden_size) and not hidden.requires_grad
    logits = backend.project(hidden)
    assert logits.shape == (len(positions), cfg.vocab_size)
    torch.testing.assert_close(
        logits, reference_logits(backend, ids)[positions], atol=1e-4, rtol=1e-4
    )
    with pytest.raises(BackendError, match="outside the sequence"):
        backend.hidden_states_at(ids, [-1])


def test_padded_batch_matches_per_sequence(qwen: HFBackend) -> None:
    tok = qwen.tokenizer
    rows = [prompt_ids(qwen), tok.encode("<final>\n48\n</final>"), prompt_ids(qwen)[:5]]
    picks = [[2, len(rows[0]) - 1], [0, 1, 2], [4]]
    width = max(map(len, rows))
    ids = torch.full((3, width), tok.pad_token_id)
    mask = torch.zeros((3, width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
        mask[r, : len(row)] = 1
    batch = PaddedTrajectoryBatch(
        input_ids=ids,
        attention_mask=mask,
        row_index=torch.tensor([r for r, p in enumerate(picks) for _ in p]),
        position_index=torch.tensor([j for p in picks for j in p]),
        row_sizes=[len(p) for p in picks],
    )
    gathered = qwen.hidden_states_at_batch(batch)
    expected = torch.cat(
        [qwen.hidden_states_at(row, p) for row, p in zip(rows, picks, strict=True)]
    )
    torch.testing.assert_close(gathered, expected, atol=1e-5, rtol=1e-4)
    expected_logits = torch.cat(
        [reference_logits(qwen, row)[p] for row, p in zip(rows, picks, strict=True)]
    )
    torch.testing.assert_close(qwen.project(gathered), expected_logits, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------ generation


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_greedy_generation_equals_transformers_generate(
    arch: str, qwen: HFBackend, llama_dir: Path
) -> None:
    backend = qwen if arch == "qwen3" else HFBackend(llama_dir)
    prompt = prompt_ids(backend)
    ours = backend.generate(prompt, max_new_tokens=24, temperature=0.0)
    with torch.no_grad():
        theirs = backend.model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=backend.tokenizer.eos_token_id,
            pad_token_id=backend.tokenizer.pad_token_id,
        )
    assert ours.token_ids == theirs[0, len(prompt) :].tolist()
    assert (
        len(set(ours.token_ids)) > 3
    )  # a non-degenerate sequence, so the comparison means something


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_kv_cached_generation_matches_full_recompute(qwen: HFBackend, temperature: float) -> None:
    prompt = prompt_ids(qwen)
    ours = qwen.generate(prompt, max_new_tokens=24, temperature=temperature, top_p=0.9, seed=4)
    reference = run_generation(
        recompute_step(lambda ids: qwen.model(input_ids=ids).logits),
        prompt,
        tokenizer=qwen.tokenizer,
        max_new_tokens=24,
        temperature=temperature,
        top_p=0.9,
        seed=4,
        eos_token_id=qwen.tokenizer.eos_token_id,
    )
    assert ours.token_ids == reference.token_ids and ours.finish_reason == reference.finish_reason
    again = qwen.generate(prompt, max_new_tokens=24, temperature=temperature, top_p=0.9, seed=4)
    assert again == ours
    if temperature > 0:
        other = qwen.generate(prompt, max_new_tokens=24, temperature=temperature, top_p=0.9, seed=5)
        assert other.token_ids != ours.token_ids


def test_generation_never_builds_full_logits(
    qwen: HFBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    widths: list[int] = []
    head = qwen._lm_head
    original = head.forward

    def spy(x: torch.Tensor) -> torch.Tensor:
        widths.append(int(x.numel() // x.shape[-1]))
        return original(x)

    monkeypatch.setattr(head, "forward", spy)
    out = qwen.generate(prompt_ids(qwen), max_new_tokens=6, temperature=0.0)
    assert widths == [1] * out.num_generated


# ---------------------------------------------------------------------------------- LoRA


def test_lora_adapters_only_and_round_trip(qwen_dir: Path, tmp_path: Path) -> None:
    lora = {"enabled": True, "r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None}
    backend = HFBackend(qwen_dir, lora=lora, seed=1)
    caps = backend.capabilities
    assert caps.lora and 0 < caps.num_trainable_parameters < 0.2 * caps.num_parameters
    state = backend.trainable_state_dict()
    assert state and all("lora_A" in n or "lora_B" in n for n in state)
    targets = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in state}
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert {id(p) for p in backend.trainable_parameters()} == {
        id(p) for p in backend.model.parameters() if p.requires_grad
    }

    ids = prompt_ids(backend)
    before = backend.project(backend.hidden_states_at(ids, [len(ids) - 1]))
    plain = HFBackend(qwen_dir)
    torch.testing.assert_close(
        before, plain.project(plain.hidden_states_at(ids, [len(ids) - 1]))
    )  # B = 0

    backend.set_train(True)
    optimizer = torch.optim.SGD(backend.trainable_parameters(), lr=0.5)
    hidden = backend.hidden_states_at(ids, [3, 7, len(ids) - 1], with_grad=True)
    torch.nn.functional.cross_entropy(backend.project(hidden), torch.tensor([5, 6, 7])).backward()
    optimizer.step()
    backend.set_train(False)
    after = backend.project(backend.hidden_states_at(ids, [len(ids) - 1]))
    assert not torch.allclose(after, before)

    path = tmp_path / "adapter.safetensors"
    save_file(backend.trainable_state_dict(), str(path))
    fresh = HFBackend(qwen_dir, lora=lora, seed=2)
    fresh.load_trainable_state_dict(load_file(str(path)))
    torch.testing.assert_close(fresh.project(fresh.hidden_states_at(ids, [len(ids) - 1])), after)
    with pytest.raises(CheckpointError, match="missing keys"):
        fresh.load_trainable_state_dict({})


def test_attaching_adapters_lets_no_future_warning_escape(qwen_dir: Path) -> None:
    """peft reads a property transformers deprecated; every HF run with LoRA printed that
    FutureWarning. The backend silences exactly that warning (and nothing else)."""
    import warnings

    from miniverl.models.hf import TEACHER_ADAPTER, quiet_third_party_noise

    lora = {"enabled": True, "r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = HFBackend(qwen_dir, lora=lora, seed=1)
        backend.add_frozen_adapter(TEACHER_ADAPTER, LoraSettings(r=4, alpha=8.0))
    future = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert future == [], [str(w.message) for w in future]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_third_party_noise():
            warnings.warn("a FutureWarning of our own", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["a FutureWarning of our own"]


def test_lora_settings_validation() -> None:
    assert LoraSettings.from_mapping(None) is None
    assert LoraSettings.from_mapping({"enabled": False, "r": 4}) is None
    assert LoraSettings.from_mapping({"r": 4, "target_modules": ["q_proj"]}) == LoraSettings(
        r=4, target_modules=("q_proj",)
    )
    with pytest.raises(ConfigError, match="unknown LoRA"):
        LoraSettings.from_mapping({"rank": 4})


# ------------------------------------------------------------------------ errors and lifecycle


@pytest.mark.skipif(CUDA, reason="checks the no-CUDA error path")
@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_quantization_without_cuda_is_a_backend_error(qwen_dir: Path, quantization: str) -> None:
    with pytest.raises(BackendError, match="needs a CUDA device") as info:
        HFBackend(qwen_dir, quantization=quantization)
    assert "quantization: none" in info.value.hint


def test_refusals(qwen_dir: Path) -> None:
    with pytest.raises(BackendError, match="trust_remote_code"):
        HFBackend(qwen_dir, trust_remote_code=True)
    with pytest.raises(ConfigError, match="precision"):
        HFBackend(qwen_dir, precision="float8")
    with pytest.raises(ConfigError, match="quantization"):
        HFBackend(qwen_dir, quantization="gptq")
    with pytest.raises(BackendError, match="could not load"):
        HFBackend(qwen_dir / "..", tokenizer=load_hf_tokenizer(qwen_dir))


def test_release_and_capabilities(qwen_dir: Path) -> None:
    backend = HFBackend(qwen_dir, precision="float32")
    caps = backend.capabilities.to_dict()
    assert (
        caps["backend"] == "hf"
        and caps["precision"] == "float32"
        and caps["quantization"] == "none"
    )
    assert caps["extra"]["architecture"] == "qwen3" and caps["extra"]["trust_remote_code"] is False
    assert caps["can_offload"] and caps["kv_cache"]
    backend.to_device("cpu")
    backend.release()
    for call in (
        lambda: backend.generate([1, 2], max_new_tokens=2),
        lambda: backend.hidden_states_at([1, 2], [0]),
        lambda: backend.project(torch.zeros(1, 64)),
        lambda: backend.trainable_state_dict(),
    ):
        with pytest.raises(BackendError, match="released"):
            call()


def test_from_spec_uses_recipe_fields(qwen_dir: Path) -> None:
    @dataclasses.dataclass
    class Spec:
        model_id: str
        revision: str | None = None
        tokenizer_id: str | None = None
        precision: str = "auto"
        quantization: str = "none"
        lora: dict | None = dataclasses.field(default_factory=lambda: {"enabled": True, "r": 2})

    student = HFBackend.from_spec(Spec(str(qwen_dir)))
    teacher = HFBackend.from_spec(Spec(str(qwen_dir)), train_adapters=False)
    assert student.capabilities.lora and not teacher.capabilities.lora
    assert student.tokenizer.fingerprint == teacher.tokenizer.fingerprint


# ------------------------------------------------------------------------ shared backbone


def test_shared_backbone_teacher_view_is_the_frozen_base(qwen_dir: Path) -> None:
    from miniverl.config.models import RunConfig

    config = RunConfig.from_mapping(
        {
            "models": {
                "backend": "hf",
                "device": "cpu",
                "runtime": "shared_backbone",
                "student": {"model_id": str(qwen_dir), "lora": {"enabled": True, "r": 4}},
                "teacher": {"model_id": str(qwen_dir), "lora": {"enabled": False}},
            }
        }
    )
    tokenizer = load_hf_tokenizer(qwen_dir)
    actor, teacher = build_shared_backbone(config, tokenizer, "cpu")
    assert isinstance(teacher, HFRoleView) and isinstance(teacher, CausalLMBackend)
    assert teacher.trainable_parameters() == [] and teacher.trainable_state_dict() == {}
    assert teacher.capabilities.num_trainable_parameters == 0 and not teacher.capabilities.lora
    assert all(".actor." in name for name in actor.trainable_state_dict())
    with torch.no_grad():
        for p in actor.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    plain = HFBackend(qwen_dir)
    ids = prompt_ids(plain)
    positions = [2, len(ids) - 1]
    torch.testing.assert_close(
        teacher.hidden_states_at(ids, positions), plain.hidden_states_at(ids, positions)
    )
    assert not torch.allclose(
        actor.hidden_states_at(ids, positions), plain.hidden_states_at(ids, positions)
    )
    greedy = teacher.generate(ids, max_new_tokens=8, temperature=0.0)
    assert greedy.token_ids == plain.generate(ids, max_new_tokens=8, temperature=0.0).token_ids

    trainable = [id(p) for p in actor.trainable_parameters()]
    with pytest.raises(
        BackendError, match="outside the sequence"
    ):  # adapters come back after an error
        teacher.hidden_states_at(ids, [len(ids)])
    assert [id(p) for p in actor.trainable_parameters()] == trainable
    hidden = actor.hidden_states_at(ids, positions, with_grad=True)
    actor.project(hidden).sum().backward()
    assert all(p.grad is not None for p in actor.trainable_parameters())

    with pytest.raises(CheckpointError):
        teacher.load_trainable_state_dict(actor.trainable_state_dict())
    teacher.release()
    actor.generate(ids, max_new_tokens=2, temperature=0.0)  # the actor keeps the weights
    with pytest.raises(BackendError, match="released"):
        teacher.generate(ids, max_new_tokens=2)


# ----------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_bf16_forward_generate_and_lora_step(qwen_dir: Path) -> None:
    backend = HFBackend(qwen_dir, device="cuda", precision="bfloat16", lora={"r": 4})
    assert backend.capabilities.precision == "bfloat16"
    ids = prompt_ids(backend)
    positions = [1, len(ids) - 1]
    logits = backend.project(backend.hidden_states_at(ids, positions))
    assert logits.dtype == torch.bfloat16 and logits.device.type == "cuda"
    torch.testing.assert_close(
        logits.float(), reference_logits(backend, ids)[positions].float(), atol=1e-1, rtol=5e-2
    )
    out = backend.generate(ids, max_new_tokens=16, temperature=0.0)
    assert out.num_generated > 0
    backend.set_train(True)
    optimizer = torch.optim.AdamW(backend.trainable_parameters(), lr=1e-2)
    before = {n: t.clone() for n, t in backend.trainable_state_dict().items()}
    hidden = backend.hidden_states_at(ids, positions, with_grad=True)
    torch.nn.functional.cross_entropy(
        backend.project(hidden).float(), torch.tensor([5, 6], device="cuda")
    ).backward()
    optimizer.step()
    after = backend.trainable_state_dict()
    assert any(not torch.equal(before[n], after[n]) for n in before)
    del optimizer, hidden, logits
    held = torch.cuda.memory_allocated()
    backend.release()
    assert torch.cuda.memory_allocated() < held


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_nf4_loading_records_peak_memory(qwen_dir: Path) -> None:
    pytest.importorskip("bitsandbytes")
    torch.cuda.reset_peak_memory_stats()
    backend = HFBackend(qwen_dir, device="cuda", quantization="nf4", lora={"r": 4})
    peak = torch.cuda.max_memory_allocated()
    caps = backend.capabilities
    assert caps.quantization == "nf4" and not caps.can_offload and peak > 0
    print(f"nf4 tiny model: peak CUDA allocated {peak / 2**20:.2f} MiB")
    out = backend.generate(prompt_ids(backend), max_new_tokens=8, temperature=0.0)
    assert out.num_generated > 0
    with pytest.raises(BackendError, match="cannot move"):
        backend.to_device("cpu")
    backend.release()
