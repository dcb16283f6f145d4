"""``training/`` reads as one recipe: few files, no import cycle, and ``train()`` within three
frames of ``optimizer.step()`` and of the loss's ``backward()``.

A reader follows one cycle down from ``OPDTrainer.train``. Every frame between it and the
update is one more function to open, so the stacks are measured on a real toy run (not read
off the source, which would miss a call routed through a helper) and bounded here:
``train()`` counts as frame 1, and the frame that calls ``optimizer.step()`` / ``backward()``
is at most frame 3 (``train`` -> ``apply_update``; ``train`` -> ``loss_step`` -> the chunked
loss).
"""

from __future__ import annotations

import ast
import traceback
from pathlib import Path
from typing import Any

import pytest

from helpers import SRC_DIR, tiny_config

TRAINING = SRC_DIR / "miniverl" / "training"
RECIPE = TRAINING / "recipe.py"
MAX_FILES = 14
MAX_FRAMES = 3
MAX_CYCLE_FILES = 3


def _training_imports(path: Path) -> set[str]:
    """The ``training`` modules ``path`` imports, at any depth (TYPE_CHECKING included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("miniverl.training."):
                found.add(node.module.split(".")[2])
            elif node.module == "miniverl.training":
                found |= {alias.name for alias in node.names}
    return found - {path.stem}


def test_training_has_at_most_fourteen_files() -> None:
    files = sorted(p.name for p in TRAINING.glob("*.py"))
    assert len(files) <= MAX_FILES, files


def test_no_training_file_reaches_itself_through_its_imports() -> None:
    graph = {p.stem: _training_imports(p) for p in TRAINING.glob("*.py")}

    def reaches(start: str, goal: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == goal:
                    return [*path, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    cycles = [path for module in graph if (path := reaches(module, module))]
    assert cycles == []


def _frames_from_train() -> list[traceback.FrameSummary]:
    """The frames from the outermost ``OPDTrainer.train`` to the patched call's caller."""
    frames = traceback.extract_stack()[:-2]  # this helper and the patched wrapper
    starts = [
        i
        for i, frame in enumerate(frames)
        if frame.name == "train" and Path(frame.filename).resolve() == RECIPE.resolve()
    ]
    assert starts, "the patched call did not happen inside OPDTrainer.train"
    return frames[starts[0] :]


@pytest.mark.parametrize("mode", ["opd", "sft"])
def test_train_is_within_three_frames_of_the_step_and_the_backward(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    from miniverl.training.recipe import OPDTrainer

    trainer = OPDTrainer(
        tiny_config(f"run.mode={mode}", "train.cycles=1"), output_dir=tmp_path / "run", quiet=True
    )
    trainer.setup()
    stacks: dict[str, list[list[traceback.FrameSummary]]] = {
        "backward": [],
        "optimizer.step": [],
    }
    backward, step = torch.Tensor.backward, trainer.optimizer.step

    def recording_backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        stacks["backward"].append(_frames_from_train())
        return backward(self, *args, **kwargs)

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        stacks["optimizer.step"].append(_frames_from_train())
        return step(*args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "backward", recording_backward)
    monkeypatch.setattr(trainer.optimizer, "step", recording_step)
    trainer.train()

    for call, seen in stacks.items():
        assert seen, f"the run never reached {call}"
        deepest = max(seen, key=len)
        names = [f"{Path(f.filename).name}:{f.name}" for f in deepest]
        assert len(deepest) <= MAX_FRAMES, (call, names)
        files = sorted({f.filename for stack in seen for f in stack})
        assert len(files) <= MAX_CYCLE_FILES, (call, files)


def test_the_frame_count_sees_a_helper_in_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step routed through one more function is four frames from ``train`` and fails the bound."""
    torch = pytest.importorskip("torch")
    from miniverl.training import recipe

    original = recipe.apply_update

    def via_helper(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    monkeypatch.setattr(recipe, "apply_update", lambda *a, **k: via_helper(*a, **k))
    trainer = recipe.OPDTrainer(
        tiny_config("train.cycles=1", "train.sft_warmup_cycles=0"),
        output_dir=tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    seen: list[int] = []
    step = trainer.optimizer.step

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        seen.append(len(_frames_from_train()))
        return step(*args, **kwargs)

    monkeypatch.setattr(trainer.optimizer, "step", recording_step)
    trainer.train()
    assert seen and max(seen) > MAX_FRAMES
    del torch


TRAINER_OWNERS = {"cli/main.py", "lab/benchmark/cell_runner.py", "lab/cycles.py"}
"""The modules that build and run an ``OPDTrainer`` (``lab/cycles.py`` runs a set-up trainer's
cycles one at a time); every other function gets explicit state."""


def _functions_taking_the_trainer(path: Path) -> list[str]:
    """Functions of ``path`` with a parameter named ``trainer`` or annotated ``OPDTrainer``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            for arg in args:
                note = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if arg.arg == "trainer" or "OPDTrainer" in note:
                    found.append(f"{node.name}({arg.arg})")
    return found


def test_no_collaborator_receives_the_trainer() -> None:
    package = SRC_DIR / "miniverl"
    offenders = {
        rel: names
        for path in sorted(package.rglob("*.py"))
        if (rel := path.relative_to(package).as_posix()) not in TRAINER_OWNERS
        and (names := _functions_taking_the_trainer(path))
    }
    assert offenders == {}, "pass the state a collaborator needs, not the trainer"


def test_the_trainer_scan_sees_a_trainer_parameter(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def a(trainer): ...\ndef b(x: 'OPDTrainer'): ...\ndef c(state): ...\n")
    assert _functions_taking_the_trainer(source) == ["a(trainer)", "b(x)"]
