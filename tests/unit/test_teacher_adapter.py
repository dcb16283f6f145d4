"""The fitted teacher adapter on a shared backbone: switching, freezing, fitting, reuse.

The lab fits it (``lab/teachers/adapter_fit.py``, through ``lab/teachers/prepare.py``) and
hands the run its file as a teacher checkpoint; the run loads it into the frozen ``teacher``
adapter. Tiny random checkpoints (``build_tiny_hf_checkpoint``); the real-model version of the
OPD cycle is in ``tests/integration/test_smollm2_real.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from miniverl.config.models import RunConfig  # noqa: E402
from miniverl.errors import BackendError, CheckpointError  # noqa: E402
from miniverl.lab.config import lab_of  # noqa: E402
from miniverl.lab.teachers import adapter_fit, dagger  # noqa: E402
from miniverl.lab.teachers.prepare import PreparedTeacher, prepare_teacher  # noqa: E402
from miniverl.models.hf import TEACHER_ADAPTER, HFBackend  # noqa: E402
from miniverl.models.hf_shared import build_shared_backbone  # noqa: E402
from miniverl.models.tiny_hf import build_tiny_hf_checkpoint  # noqa: E402
from miniverl.models.tokenizers import load_hf_tokenizer  # noqa: E402
from miniverl.training.recipe import OPDTrainer  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning"),
    pytest.mark.usefixtures("one_torch_thread"),
]
PROMPT = "<|im_start|>user\nCompute 12 * (7 - 3) and report the value.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_hf_checkpoint(tmp_path_factory.mktemp("tiny"), arch="llama", seed=2)


def _config(model: Path, cache_dir: Path, **fit: Any) -> RunConfig:
    return RunConfig.from_mapping(
        {
            "run": {"name": "tiny-teacher-adapter", "seed": 5},
            "models": {
                "backend": "hf",
                "device": "cpu",
                "runtime": "shared_backbone",
                "student": {"model_id": str(model), "lora": {"enabled": True, "r": 4}},
                "teacher": {"model_id": str(model), "lora": {"enabled": True, "r": 2}},
                "teacher_fit": {
                    "enabled": True,
                    "steps": 2,
                    "batch_size": 2,
                    "extra_tasks": 2,
                    "corrective_fraction": 0.5,
                    "probe_tasks": 1,
                    "cache_dir": str(cache_dir),
                    **fit,
                },
            },
            "environment": {"train_tasks": 2, "eval_tasks": 1},
            "rollout": {"max_turns": 1, "max_new_tokens_per_turn": 4},
            "loss": {"top_k": 8},
            "train": {"cycles": 1, "rollouts_per_cycle": 2, "sft_warmup_cycles": 0},
        }
    )


def _hidden(backend: Any, ids: list[int]) -> torch.Tensor:
    return backend.hidden_states_at(ids, [1, len(ids) - 1])


def _shared(config: RunConfig) -> Any:
    """The shared base with the frozen teacher adapter the lab fits."""
    return build_shared_backbone(
        config,
        load_hf_tokenizer(config.models.student.model_id),
        "cpu",
        teacher_adapter=lab_of(config).teacher_fit.lora,
    )


def test_the_teacher_adapter_is_switched_in_and_never_trained(
    tiny_dir: Path, tmp_path: Path
) -> None:
    config = _config(tiny_dir, tmp_path)
    actor, teacher = _shared(config)
    assert teacher.adapter == TEACHER_ADAPTER
    teacher_params = teacher.unfrozen_adapter_parameters()
    assert teacher_params and not any(p.requires_grad for p in teacher_params)
    trainable = {id(p) for p in actor.trainable_parameters()}
    assert trainable and trainable.isdisjoint(id(p) for p in teacher_params)
    assert all(".actor." in k for k in actor.trainable_state_dict())

    plain = HFBackend(tiny_dir)
    ids = plain.tokenizer.encode(PROMPT)
    base = _hidden(plain, ids)
    torch.testing.assert_close(_hidden(teacher, ids), base)  # zero-initialised B
    with torch.no_grad():
        for p in teacher_params:
            p.add_(0.1 * torch.randn_like(p))
    fitted = _hidden(teacher, ids)
    assert not torch.allclose(fitted, base), "the teacher view must run its own adapter"
    torch.testing.assert_close(_hidden(actor, ids), base)  # the actor's adapter is back
    assert actor.model.active_adapter == "actor"

    with torch.no_grad():
        for p in actor.trainable_parameters():
            p.add_(0.1 * torch.randn_like(p))
    torch.testing.assert_close(_hidden(teacher, ids), fitted)  # not the actor's adapter

    with pytest.raises(BackendError, match="outside the sequence"):
        teacher.hidden_states_at(ids, [len(ids)])
    assert actor.model.active_adapter == "actor"
    assert {id(p) for p in actor.trainable_parameters()} == trainable

    hidden = actor.hidden_states_at(ids, [1, len(ids) - 1], with_grad=True)
    with torch.no_grad():
        teacher.project(_hidden(teacher, ids))
    actor.project(hidden).sum().backward()
    assert all(p.grad is not None for p in actor.trainable_parameters())
    assert all(p.grad is None for p in teacher_params)


def test_fit_adapter_changes_only_the_teacher_adapter(tiny_dir: Path, tmp_path: Path) -> None:
    actor, teacher = _shared(_config(tiny_dir, tmp_path))
    before = {k: v.clone() for k, v in actor.model.state_dict().items()}
    ids = actor.tokenizer.encode(PROMPT + "<final>\n48\n</final>")
    history = adapter_fit.fit_adapter(
        teacher, [(ids, list(range(len(ids) - 6, len(ids))))] * 2,
        steps=3, lr=1e-2, batch_size=2, seed=0, chunk_size=16,
    )  # fmt: skip
    assert len(history) == 3 and history[-1] < history[0]
    changed = {k for k, v in actor.model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(f".{TEACHER_ADAPTER}." in k for k in changed)
    assert not any(
        p.requires_grad or p.grad is not None for p in teacher.unfrozen_adapter_parameters()
    )
    assert all(".actor." in k for k in actor.trainable_state_dict())


def _trainer(config: RunConfig, out: Path, prepared: PreparedTeacher | None = None) -> OPDTrainer:
    """A set-up run whose teacher is ``prepared``'s adapter file (none: the plain base)."""
    trainer = OPDTrainer(
        config,
        output_dir=out,
        quiet=True,
        teacher=None if prepared is None else prepared.teacher,
        teacher_record=None if prepared is None else prepared.record,
    )
    trainer.setup()
    return trainer


def test_the_fitted_adapter_is_saved_and_reused_by_digest(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "adapters"
    first = prepare_teacher(_config(tiny_dir, cache))
    report = first.record
    assert report is not None and report["reused"] is False and report["steps"] == 2
    assert report["oracle_traces"] == 4 and report["corrective_traces"] == 2
    saved = Path(report["directory"])
    assert saved.parent == cache and saved.name == report["digest"]
    assert first.teacher == saved / adapter_fit.ADAPTER_FILE
    fitted = _trainer(_config(tiny_dir, cache), tmp_path / "a", first).student.adapter_state(
        TEACHER_ADAPTER
    )
    assert any(v.abs().sum() > 0 for v in fitted.values()), "the run loaded the fitted adapter"

    def no_refit(*_: Any, **__: Any) -> Any:
        raise AssertionError("an unchanged fit config must not be refitted")

    monkeypatch.setattr(adapter_fit, "fit_adapter", no_refit)
    again = prepare_teacher(_config(tiny_dir, cache))
    assert again.record is not None and again.record["reused"] is True
    assert again.record["digest"] == report["digest"]
    loaded = _trainer(_config(tiny_dir, cache), tmp_path / "b", again).student.adapter_state(
        TEACHER_ADAPTER
    )
    assert loaded.keys() == fitted.keys()
    assert all(torch.equal(loaded[k], fitted[k]) for k in fitted)

    other = _config(tiny_dir, cache, steps=3)
    fingerprint = load_hf_tokenizer(tiny_dir).fingerprint
    payload = adapter_fit.fit_payload(other, lab_of(other).teacher_fit, fingerprint)
    assert adapter_fit.fit_digest(payload) != report["digest"]

    adapter_file = saved / adapter_fit.ADAPTER_FILE
    data = bytearray(adapter_file.read_bytes())
    data[-1] ^= 1
    adapter_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match the SHA-256"):
        prepare_teacher(_config(tiny_dir, cache))


def test_corrective_traces_supervise_only_the_correction(tiny_dir: Path, tmp_path: Path) -> None:
    trainer = _trainer(_config(tiny_dir, tmp_path), tmp_path / "run")
    task = trainer.splits["train"][0]
    for noise in adapter_fit.NOISE_KINDS:
        traj = trainer.runner.corrective_rollout(task, noise)
        start = traj.metadata["supervise_from"]
        targets = adapter_fit.corrective_targets(traj)
        first_noise = next(s for s in traj.spans if s.is_model_generated)
        assert targets and min(targets) >= start > first_noise.end
        assert traj.solved and traj.invalid_tool_calls == 1
        assert traj.turns[0].tool_call is not None and (
            traj.turns[0].tool_call.valid is False or traj.turns[0].tool_result.ok is False
        )
    examples, counts = adapter_fit.fit_examples(
        trainer.config,
        lab_of(trainer.config).teacher_fit,
        splits=trainer.splits,
        environment=trainer.environment,
        runner=trainer.runner,
    )
    held_out = {t.task_id for t in trainer.splits["eval"]}
    assert counts == {"oracle_traces": 4, "corrective_traces": 2, "extra_tasks": 2}
    assert len(examples) == 6 and not held_out & {t.task_id for t in trainer.splits["train"]}


def test_the_two_smollm2_recipes_share_one_teacher_adapter() -> None:
    """Same fit inputs -> same digest, so either recipe reuses the adapter the other fitted."""
    from helpers import REPO_ROOT
    from miniverl.lab.config import load_recipe

    plain = load_recipe(REPO_ROOT / "recipes" / "smollm2_calc_cpu.yaml")
    privileged = load_recipe(REPO_ROOT / "recipes" / "smollm2_calc_cpu_privileged.yaml")
    assert (plain.teacher.mode, privileged.teacher.mode) == ("standard", "privileged_context")
    assert plain.models.runtime == privileged.models.runtime == "shared_backbone"
    assert plain.lab.teacher_fit.enabled and privileged.lab.teacher_fit.enabled

    def digest(cfg: RunConfig) -> str:
        return adapter_fit.fit_digest(adapter_fit.fit_payload(cfg, lab_of(cfg).teacher_fit, "f"))

    assert digest(plain) == digest(privileged)
    assert digest(plain) != digest(plain.with_overrides(["models.teacher.lora.r=4"]))


def test_dagger_rows_fit_the_hf_adapter_through_the_shared_path(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """The toy teacher's student-state rows (``dagger_examples``) fit the HF adapter one step
    through ``lab/teachers/fitting.py``, and the rows enter the adapter's digest."""
    from miniverl.environments.registry import make_environment
    from miniverl.environments.tasks_file import build_splits
    from miniverl.lab.config import DaggerConfig

    config = _config(tiny_dir, tmp_path)
    actor, teacher = _shared(config)
    env = make_environment(config.environment.name, **config.environment.params)
    train = build_splits(env, config.environment)["train"]
    rows, counts = dagger.dagger_examples(
        actor, env, train, DaggerConfig(enabled=True), config.rollout, seed=0, batch_size=2
    )
    assert counts["dagger_episodes"] == len(train) and len(rows) == counts["dagger_states"] > 0
    assert any(
        actor.tokenizer.decode([ids[j] for j in targets]).startswith("<tool_call>")
        for ids, targets in rows
    )
    before = [p.detach().clone() for p in teacher.unfrozen_adapter_parameters()]
    history = adapter_fit.fit_adapter(
        teacher, rows, steps=1, lr=1e-2, batch_size=2, seed=0, chunk_size=16
    )
    assert len(history) == 1 and history[0] == history[0]
    after = teacher.unfrozen_adapter_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    fp, fit = actor.tokenizer.fingerprint, lab_of(config).teacher_fit
    with_rows = adapter_fit.fit_digest(adapter_fit.fit_payload(config, fit, fp, rows))
    fewer = adapter_fit.fit_digest(adapter_fit.fit_payload(config, fit, fp, rows[:-1]))
    assert with_rows != fewer


def _saved_fit(tiny_dir: Path, cache: Path) -> tuple[Path, dict[str, Any]]:
    report = prepare_teacher(_config(tiny_dir, cache)).record
    assert report is not None and report["reused"] is False
    return Path(report["directory"]), report


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("base", {"model_id": "/elsewhere/another-base"}),
        ("tokenizer_fingerprint", "another-tokenizer"),
        ("lora", {"enabled": True, "r": 8}),
    ],
)
def test_a_saved_adapter_fitted_for_another_base_or_tokenizer_is_refused(
    tiny_dir: Path, tmp_path: Path, field: str, value: Any
) -> None:
    """A directory whose fit names another base, tokenizer or adapter shape is a typed error
    naming the field, before a tensor is loaded."""
    import json

    cache = tmp_path / "adapters"
    saved, _ = _saved_fit(tiny_dir, cache)
    report_path = saved / adapter_fit.REPORT_FILE
    report = json.loads(report_path.read_text(encoding="utf-8"))
    report["payload"][field] = value
    report_path.write_text(json.dumps(report), encoding="utf-8")
    with pytest.raises(
        CheckpointError, match=f"fitted for another base model or tokenizer \\({field}: saved"
    ) as err:
        prepare_teacher(_config(tiny_dir, cache))
    assert str(saved) in err.value.hint and "refitted" in err.value.hint


def test_adapter_tensors_of_another_shape_are_a_typed_error(tiny_dir: Path, tmp_path: Path) -> None:
    """An adapter file of the right names but another rank (a file copied in by hand) is a
    CheckpointError naming the tensor and both shapes, not a raw copy error."""
    from safetensors.torch import load_file, save_file

    saved, _ = _saved_fit(tiny_dir, tmp_path / "adapters")
    state = load_file(str(saved / adapter_fit.ADAPTER_FILE))
    key = next(k for k in state if "lora_A" in k)
    state[key] = torch.zeros(state[key].shape[0] + 1, state[key].shape[1])
    other = tmp_path / "other.safetensors"
    save_file(state, str(other))
    _, view = _shared(_config(tiny_dir, tmp_path / "adapters"))
    with pytest.raises(CheckpointError, match="other shapes than this model's") as err:
        adapter_fit._load_adapter(view, other)
    assert key in str(err.value) and "delete that directory" in err.value.hint


def test_the_identity_check_compares_the_payload_as_fit_json_stores_it(tmp_path: Path) -> None:
    """A tuple in the live payload is a list once saved; that alone is not another base."""
    saved = {"base": {"model_id": "m"}, "lora": {"target_modules": ["q_proj", "v_proj"]}}
    live = {"base": {"model_id": "m"}, "lora": {"target_modules": ("q_proj", "v_proj")}}
    adapter_fit.check_fit_identity(saved, live, tmp_path)
    with pytest.raises(CheckpointError, match="lora: saved"):
        adapter_fit.check_fit_identity(
            saved, {**live, "lora": {"target_modules": ("q_proj",)}}, tmp_path
        )


def test_an_hf_teacher_adapter_is_gated_on_held_out_student_states(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """The held-out state gate scores the fitted adapter (not only the toy teacher); a failed
    gate refuses the arms unless ``lab.teacher_gate.required`` is false, which is recorded."""
    from miniverl.errors import TeacherGateError
    from miniverl.lab.benchmark.cell_runner import gate_subject
    from miniverl.lab.teachers.gate import (
        STATE_GATE_FILE,
        cold_start_teacher_gate,
        refuse_failed_gates,
    )

    base = _config(tiny_dir, tmp_path / "adapters").model_dump(mode="json")
    base["environment"] = {
        "name": "calc_chain",
        "difficulty": "mixed",
        "params": {"train_k": [1], "eval_k": [1], "test_k": [1]},
        "train_tasks": 2,
        "eval_tasks": 2,
    }
    base["rollout"] = {"max_turns": 4, "max_new_tokens_per_turn": 6}
    base["train"].update(cycles=0)
    base["eval"].update(teacher_gate_tasks=2, teacher_gate_recovery=1.0, baseline=False)
    gates = {}
    for required in (True, False):
        base["eval"]["teacher_gate_required"] = required
        config = RunConfig.from_mapping(base)
        prepared = prepare_teacher(config)
        trainer = _trainer(config, tmp_path / f"run-{required}", prepared)
        trainer.train()
        gates[required] = cold_start_teacher_gate(gate_subject(trainer, prepared))
        stored = (trainer.paths.root / STATE_GATE_FILE).read_text()
        assert '"recovery_rate"' in stored
    for gate in gates.values():
        assert not gate.get("skipped")
        states = gate["states"]
        assert states["thresholds"] == {"recovery_rate": 1.0}
        assert states["on_path_agreement"] is not None
    assert gates[False].pop("required") is False and gates[False] == gates[True]
    assert gates[True]["passed"] is False  # a random 2-layer teacher recovers nothing
    refuse_failed_gates([{"seed": 1, "teacher_gate": {**gates[True], "required": False}}])
    with pytest.raises(TeacherGateError, match="teacher gate failed for seed 1") as info:
        refuse_failed_gates([{"seed": 1, "teacher_gate": gates[True]}])
    failures = gates[True]["states"]["failures"]
    assert failures and f"the held-out state gate failed ({'; '.join(failures)})" in str(info.value)


def test_a_dagger_adapter_fits_the_students_labelled_states_and_is_named_by_them(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "adapters"
    config = _config(tiny_dir, cache, dagger={"enabled": True, "rollouts_per_task": 2})
    with pytest.raises(Exception, match="only a benchmark's cold start has one"):
        prepare_teacher(config)
    seen: list[list[str]] = []
    real = adapter_fit.dagger_examples

    def spy(student, environment, train, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append([t.task_id for t in train])
        return real(student, environment, train, *args, **kwargs)

    monkeypatch.setattr(adapter_fit, "dagger_examples", spy)
    first = _trainer(config, tmp_path / "a")
    prepared = prepare_teacher(config, student=first.student)
    report = prepared.record
    assert report is not None and report["reused"] is False
    assert seen == [[t.task_id for t in first.splits["train"]]]
    assert report["dagger_episodes"] == 2 * len(first.splits["train"])
    fitted_rows = report["oracle_traces"] + report["corrective_traces"] + report["dagger_states"]
    assert report["dagger_states"] > 0 and report["cost"]["examples"] == fitted_rows
    from miniverl.lab.teachers.toy_fit import tensors_sha256

    live = tensors_sha256(first.student.trainable_state_dict())
    assert report["payload"]["dagger_student_sha256"] == live
    assert prepared.backend is not None and prepared.backend.adapter == TEACHER_ADAPTER

    again = prepare_teacher(config, student=_trainer(config, tmp_path / "b").student).record
    assert again is not None and again["reused"] and again["digest"] == report["digest"]
    assert len(seen) == 1  # a reused adapter rolls nothing out

    moved = _trainer(config, tmp_path / "c")
    with torch.no_grad():
        next(iter(moved.student.trainable_parameters())).add_(0.01)
    other = prepare_teacher(config, student=moved.student).record
    assert other is not None and other["digest"] != report["digest"] and not other["reused"]


def test_a_cold_start_keeps_its_adapter_and_its_arms_load_it_from_there(
    tiny_dir: Path, tmp_path: Path
) -> None:
    from miniverl.lab.benchmark.cold_start import save_cold_start
    from miniverl.lab.teachers.prepare import COLD_START_ADAPTER

    config = _config(tiny_dir, tmp_path / "adapters", dagger={"enabled": True})
    cold_run = _trainer(config.with_overrides(["train.cycles=0"]), tmp_path / "cold-run")
    cold_run.train()
    prepared = prepare_teacher(config, student=cold_run.student)
    cold = save_cold_start(
        tmp_path / "cold-start",
        config=config,
        student=cold_run.student,
        teacher=prepared,
        parameter_version=0,
        global_step=0,
        evaluations={},
    )
    assert (cold / COLD_START_ADAPTER).read_bytes() == Path(prepared.teacher).read_bytes()
    arm = prepare_teacher(config, cold_start=cold)
    assert arm.teacher == cold / COLD_START_ADAPTER
    assert arm.record is not None and arm.record["digest"] == prepared.record["digest"]
    run = _trainer(config, tmp_path / "arm", arm)
    loaded = run.student.adapter_state(TEACHER_ADAPTER)
    fitted = prepared.backend.owner.adapter_state(TEACHER_ADAPTER)
    assert all(torch.equal(loaded[k].cpu(), fitted[k].cpu()) for k in fitted)


def test_a_fit_started_from_a_trained_adapter_begins_at_its_tensors(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """``lab.teacher_fit.init_from``: with no steps the saved adapter is the starting one, bit
    for bit (from zeros it would not be); the digest names the starting bytes, not their path;
    a wrong path or shape fails naming the key."""
    from safetensors.torch import load_file

    cache = tmp_path / "adapters"
    trained = prepare_teacher(_config(tiny_dir, cache)).record
    assert trained is not None
    source = Path(trained["adapter"])
    start = load_file(str(source))
    assert any(v.abs().sum() > 0 for k, v in start.items() if "lora_B" in k)

    copy = tmp_path / "elsewhere" / "start.safetensors"
    copy.parent.mkdir()
    copy.write_bytes(source.read_bytes())
    began = prepare_teacher(_config(tiny_dir, cache, steps=0, init_from=str(copy))).record
    assert began is not None and not began["reused"] and began["steps"] == 0
    assert began["payload"]["init_sha256"] == trained["adapter_sha256"]
    assert began["init_from"]["sha256"] == trained["adapter_sha256"]
    saved = load_file(began["adapter"])
    assert saved.keys() == start.keys()
    assert all(torch.equal(saved[k], start[k]) for k in start)
    fresh = prepare_teacher(_config(tiny_dir, cache, steps=0)).record
    assert fresh is not None and "init_sha256" not in fresh["payload"]
    zeros = load_file(fresh["adapter"])
    assert all(not zeros[k].any() for k in zeros if "lora_B" in k)

    fingerprint = load_hf_tokenizer(tiny_dir).fingerprint
    same = _config(tiny_dir, cache, steps=0, init_from=str(source))
    assert adapter_fit.fit_digest(
        adapter_fit.fit_payload(same, lab_of(same).teacher_fit, fingerprint)
    ) == adapter_fit.fit_digest(
        adapter_fit.fit_payload(
            _config(tiny_dir, cache, steps=0, init_from=str(copy)),
            lab_of(same).teacher_fit.model_copy(update={"init_from": str(copy)}),
            fingerprint,
        )
    )
    data = bytearray(copy.read_bytes())
    data[-1] ^= 1
    copy.write_bytes(bytes(data))
    moved = _config(tiny_dir, cache, steps=0, init_from=str(copy))
    payload = adapter_fit.fit_payload(moved, lab_of(moved).teacher_fit, fingerprint)
    assert payload["init_sha256"] != trained["adapter_sha256"]

    with pytest.raises(CheckpointError, match=r"^lab\.teacher_fit\.init_from: ") as missing:
        prepare_teacher(_config(tiny_dir, cache, init_from=str(tmp_path / "nowhere")))
    assert "point lab.teacher_fit.init_from at" in missing.value.hint
    wide = _config(tiny_dir, cache, init_from=str(source)).with_overrides(
        ["models.teacher.lora.r=4"]
    )
    assert lab_of(wide).teacher_fit.lora.r == 4
    before = sorted(p.name for p in cache.iterdir())
    with pytest.raises(
        CheckpointError, match=r"^lab\.teacher_fit\.init_from: .* tensors of another"
    ):
        prepare_teacher(wide)
    assert sorted(p.name for p in cache.iterdir()) == before
