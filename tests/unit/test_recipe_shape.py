"""``training/`` reads as one recipe: few files, no import cycle, and one cycle's update in
at most three files.

A reader follows one cycle from ``OPDTrainer.run_cycle`` to the loss backward and to
``optimizer.step()``. Every file on those call stacks is one more file to open, so the
stacks are measured on a real toy OPD cycle (not read off the source, which would miss a
call routed through a helper module) and bounded here.
"""

from __future__ import annotations

import ast
import traceback
from pathlib import Path
from typing import Any

import pytest

from helpers import SRC_DIR, tiny_config

TRAINING = SRC_DIR / "miniverl" / "training"
MAX_FILES = 14
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


def _stack_files() -> list[str]:
    """Files of the frames from the innermost ``run_cycle`` to the patched call's caller."""
    frames = traceback.extract_stack()[:-2]  # this helper and the patched wrapper
    starts = [i for i, frame in enumerate(frames) if frame.name == "run_cycle"]
    assert starts, "the patched call did not happen inside run_cycle"
    return [frame.filename for frame in frames[starts[-1] :]]


@pytest.mark.parametrize("mode", ["opd", "sft"])
def test_cycle_spans_at_most_three_files(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    from miniverl.training.trainer import OPDTrainer

    trainer = OPDTrainer(
        tiny_config(f"run.mode={mode}", "train.cycles=1"), output_dir=tmp_path / "run", quiet=True
    )
    trainer.setup()
    stacks: dict[str, list[list[str]]] = {"backward": [], "optimizer.step": []}
    backward, step = torch.Tensor.backward, trainer.optimizer.step

    def recording_backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        stacks["backward"].append(_stack_files())
        return backward(self, *args, **kwargs)

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        stacks["optimizer.step"].append(_stack_files())
        return step(*args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "backward", recording_backward)
    monkeypatch.setattr(trainer.optimizer, "step", recording_step)
    trainer.run_cycle(0)

    for call, seen in stacks.items():
        assert seen, f"one cycle never reached {call}"
        files = sorted({f for stack in seen for f in stack})
        assert len(files) <= MAX_CYCLE_FILES, (call, files)
        assert all(
            Path(stack[0]).resolve() == (TRAINING / "trainer.py").resolve() for stack in seen
        )


TRAINER_OWNERS = {"cli/main.py", "evaluation/cell_runner.py"}
"""The modules that build and run an ``OPDTrainer``; every other function gets explicit state."""


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
