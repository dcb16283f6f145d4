"""The manifest and the role graph are built from explicit inputs (training/manifest.py).

No trainer is constructed here: every value ``manifest.json`` holds arrives through
``ManifestInputs`` or the keyword arguments of ``LocalRoleGraph.local``, and the modules
that build it cannot reach a trainer (checked on their imports).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from helpers import SRC_DIR, tiny_config
from miniverl.environments.calculator import CalculatorEnvironment
from miniverl.models.base import BackendCapabilities
from miniverl.models.runtime import ModelRuntime
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.training.manifest import (
    ROLES,
    LocalRoleGraph,
    ManifestInputs,
    build_manifest,
    objective_block,
)
from miniverl.training.resolve import HostCapabilities, resolve_run
from miniverl.training.run_state import RunState


def _caps(model_id: str) -> BackendCapabilities:
    return BackendCapabilities(
        backend="toy",
        model_id=model_id,
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


class FakeBackend:
    def __init__(self, model_id: str) -> None:
        self.capabilities = _caps(model_id)


class FakeRunner:
    pass


class FakeScorer:
    def __init__(self, shape: str) -> None:
        self.shape = shape


def _inputs(**changes: Any) -> ManifestInputs:
    config = changes.pop("config", None) or tiny_config("loss.top_k=8")
    student, teacher = FakeBackend("toy-student"), FakeBackend("toy-teacher")
    resolved = resolve_run(
        config,
        device="cpu",
        host=HostCapabilities(cuda_available=False, torch_threads=4),
        student=student.capabilities,
        teacher=teacher.capabilities,
    )
    scorer = FakeScorer(changes.pop("scorer_shape", "bucketed"))
    graph = LocalRoleGraph.local(
        runtime=ModelRuntime("dual_model", student, teacher),  # type: ignore[arg-type]
        runner=FakeRunner(),  # type: ignore[arg-type]
        environment=CalculatorEnvironment(),
        scorer=scorer,  # type: ignore[arg-type]
        cache_directory=Path("/somewhere/teacher-cache"),
        recipe="OPDTrainer",
    )
    base = dict(
        config=config,
        resolved=resolved,
        run_id="run-1",
        environment=CalculatorEnvironment(),
        split_sizes={"train": 8, "eval": 2, "test": 0},
        tokenizer=ToyTokenizer(),
        student=student,
        teacher=teacher,
        role_graph=graph,
        scorer_shape=scorer.shape,
        cache_in_use=True,
        state=RunState(
            chunk_size=resolved.chunk_size,
            trajectory_batch_size=resolved.trajectory_batch_size,
            global_step=3,
            parameter_version=3,
            rollout_version=2,
            policy_fingerprint="abc",
        ),
        teacher_record=None,
    )
    base.update(changes)
    return ManifestInputs(**base)  # type: ignore[arg-type]


def test_the_role_graph_binds_exactly_the_objects_it_is_given() -> None:
    roles = _inputs().role_graph.to_dict()["roles"]
    assert list(roles) == list(ROLES)
    assert roles["ActorPolicy"] == {
        "bound_to": "FakeBackend",
        "model_id": "toy-student",
        "runtime": "dual_model",
    }
    assert roles["TeacherPolicy"] == {"bound_to": "FakeBackend", "model_id": "toy-teacher"}
    assert roles["RolloutRuntime"]["bound_to"] == "FakeRunner"
    assert roles["RewardOrVerifier"]["bound_to"] == "CalculatorEnvironment"
    assert roles["TargetBuilder"] == {"bound_to": "FakeScorer", "shape": "bucketed"}
    assert roles["UpdateRuntime"] == {"bound_to": "OPDTrainer", "method": "loss_step"}
    assert roles["EvaluationRuntime"] == {"bound_to": "OPDTrainer", "method": "evaluate"}
    assert roles["ArtifactBridge"]["cache"] == "teacher-cache"
    assert roles["ReferencePolicy"]["bound_to"] is None


def test_the_role_graph_names_methods_that_exist() -> None:
    """Both named methods are defined on ``OPDTrainer`` (read from the source, so this module
    still never imports the trainer)."""
    tree = ast.parse((SRC_DIR / "miniverl" / "training" / "recipe.py").read_text("utf-8"))
    defined = {
        f"{cls.name}.{fn.name}"
        for cls in tree.body
        if isinstance(cls, ast.ClassDef)
        for fn in cls.body
        if isinstance(fn, ast.FunctionDef)
    }
    assert {"OPDTrainer.evaluate", "OPDTrainer.loss_step"} <= defined


def test_there_is_no_trainer_shaped_constructor_left() -> None:
    import miniverl.models.runtime as runtime

    assert not hasattr(LocalRoleGraph, "for_trainer")
    assert not hasattr(runtime, "LocalRoleGraph")


@pytest.mark.parametrize("module", ["manifest.py", "resolve.py", "evaluate.py"])
def test_manifest_resolve_and_evaluate_never_import_the_trainer(module: str) -> None:
    tree = ast.parse((SRC_DIR / "miniverl" / "training" / module).read_text(encoding="utf-8"))
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "miniverl.training.recipe" not in imported


def test_the_manifest_reports_the_resolved_plan_and_the_live_sizes() -> None:
    inputs = _inputs()
    live = dataclasses.replace(
        inputs, state=dataclasses.replace(inputs.state, chunk_size=7, trajectory_batch_size=1)
    )
    manifest = build_manifest(live)
    assert manifest["projection_chunk_size"] == 7
    batching = manifest["batching"]
    assert batching["trajectory_batch_size"] == 1
    assert batching["trajectory_batch_planned"] == inputs.resolved.trajectory_batch_size == 2
    assert batching["trajectory_batch_reason"] == inputs.resolved.trajectory_batch_reason
    assert batching["cpu_threads"] == 1
    assert manifest["memory_plan"] == inputs.resolved.memory_plan.to_dict()
    assert manifest["objective"]["top_k"] == 8
    assert manifest["environment"]["split_sizes"] == {"train": 8, "eval": 2, "test": 0}
    assert manifest["models"]["teacher"]["capabilities"]["model_id"] == "toy-teacher"
    assert (manifest["run_id"], manifest["policy_fingerprint"]) == ("run-1", "abc")
    assert manifest["rollout_policy_version"] == 2
    assert manifest["measurement_status"]["cache"] == "enabled"
    assert manifest["role_graph"] == inputs.role_graph.to_dict()


def test_the_objective_block_follows_the_scorer_shape_and_mode() -> None:
    inputs = _inputs()
    bucketed = objective_block(inputs.config, inputs.resolved, "bucketed")
    assert (bucketed["supervision_shape"], bucketed["top_k"]) == ("bucketed_topk_plus_tail", 8)
    exact = objective_block(inputs.config, inputs.resolved, "exact_hidden")
    assert (exact["supervision_shape"], exact["top_k"]) == ("exact_hidden", None)
    sft = tiny_config("run.mode=sft")
    sft_inputs = _inputs(config=sft)
    block = objective_block(sft, sft_inputs.resolved, None)
    assert (block["supervision_shape"], block["divergence"]) == ("oracle_tokens", "cross_entropy")
    assert block["loss_temperature"] is None and block["sft_warmup_cycles"] == 0
    assert build_manifest(dataclasses.replace(sft_inputs, cache_in_use=False))[
        "measurement_status"
    ]["cache"] == ("not_used")


def test_seqkd_is_reported_as_cross_entropy_on_teacher_samples_not_as_a_divergence() -> None:
    seqkd = tiny_config("run.mode=seqkd")
    block = objective_block(seqkd, _inputs(config=seqkd).resolved, "bucketed")
    assert (block["label"], block["divergence"]) == (
        "sequence_level_knowledge_distillation",
        "cross_entropy",
    )
    assert block["loss_temperature"] is None
    assert block["sft_warmup_cycles"] == seqkd.train.sft_warmup_cycles
