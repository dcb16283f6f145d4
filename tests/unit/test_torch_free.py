"""The torch-free surfaces (inspect, validate, doctor) never import torch, and work without it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import run_python, write_oracle_file
from miniverl.utils.lazy import INSTALL_HINT

_CHILD = r"""
import json
import sys

mode, traj_path, recipe_path, traj_id = sys.argv[1:5]
if mode == "block":
    class _NoTorch:
        '''An import hook that makes torch (and every torch.* module) unimportable.'''

        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, _NoTorch())
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("the torch blocker did not work")

import miniverl.cli
import miniverl.cli.main as cli
from typer.testing import CliRunner

runner = CliRunner()
out = {}
commands = {
    "inspect": ["inspect", traj_path],
    "inspect_json": ["inspect", traj_path, "--json", "--trajectory", traj_id, "--spans"],
    "validate": ["validate", recipe_path],
    "doctor": ["doctor", "--no-torch-probe"],
    "doctor_json": ["doctor", "--json"],
}
if mode == "block":
    commands["train"] = ["train", recipe_path, "--output", recipe_path + ".run"]
for name, args in commands.items():
    result = runner.invoke(cli.app, args)
    out[name] = {"exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
                 "exception": repr(result.exception) if result.exit_code else None}
out["torch_in_sys_modules"] = "torch" in sys.modules
out["heavy_modules"] = sorted(m for m in ("torch", "numpy", "safetensors", "transformers") if m in sys.modules)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("torch_free")
    traj_path = root / "trajectories.jsonl"
    trajectories = write_oracle_file(traj_path, 2)
    recipe = root / "recipe.yaml"
    recipe.write_text("train:\n  cycles: 2\nloss:\n  divergence: reverse_kl\n", encoding="utf-8")
    return traj_path, recipe, trajectories[0].trajectory_id


def _run(mode: str, inputs: tuple[Path, Path, str]) -> dict:
    traj_path, recipe, traj_id = inputs
    proc = run_python(_CHILD, args=[mode, str(traj_path), str(recipe), traj_id])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_commands(out: dict, inputs: tuple[Path, Path, str]) -> None:
    for name in ("inspect", "inspect_json", "validate", "doctor", "doctor_json"):
        assert out[name]["exit_code"] == 0, (name, out[name])
    assert "2 trajectories" in out["inspect"]["stdout"]
    summary = json.loads(out["inspect_json"]["stdout"])
    assert summary["trajectories"] == 1 and summary["spans"]
    assert "provenance_check" in summary
    assert (
        "valid " in out["validate"]["stdout"]
        and "divergence: reverse_kl" in out["validate"]["stdout"]
    )
    assert "doctor" in out["doctor"]["stdout"]


def test_commands_never_import_torch(inputs: tuple[Path, Path, str]) -> None:
    out = _run("plain", inputs)
    _check_commands(out, inputs)
    assert "Training needs torch" not in out["doctor"]["stdout"]  # it is installed here
    assert out["torch_in_sys_modules"] is False
    assert out["heavy_modules"] == []


def test_commands_work_with_torch_unimportable(inputs: tuple[Path, Path, str]) -> None:
    out = _run("block", inputs)
    _check_commands(out, inputs)
    assert out["torch_in_sys_modules"] is False
    # doctor asks whether torch is importable and reports it absent instead of failing.
    assert json.loads(out["doctor_json"]["stdout"])["torch"]["status"] == "absent"
    # a training command says which extra to install instead of crashing with a traceback
    assert out["train"]["exit_code"] == 1
    assert "torch is not installed (needed for miniverl train)" in out["train"]["stderr"]
    # doctor and train give the README's install line, and the same one
    assert f"Training needs torch: {INSTALL_HINT}" in " ".join(out["doctor"]["stdout"].split())
    assert INSTALL_HINT in " ".join(out["train"]["stderr"].split())


def test_importing_the_package_is_light() -> None:
    proc = run_python(
        "import sys, miniverl, miniverl.schemas, miniverl.trajectory.io, miniverl.trajectory.alignment, "
        "miniverl.selection.selectors, miniverl.config.models, miniverl.environments.registry, "
        "miniverl.agent.loop, miniverl.inspection.summary, miniverl.utils.env, miniverl.utils.seeding, "
        "miniverl.utils.logging, miniverl.utils.runs, miniverl.models.tokenizers, miniverl.models.base\n"
        "print(sorted(m for m in ('torch', 'numpy', 'transformers', 'safetensors') if m in sys.modules))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_is_available_never_raises() -> None:
    from miniverl.utils.lazy import is_available

    assert is_available("json") is True
    assert is_available("no_such_module_for_miniverl") is False
    assert is_available("no_such_module_for_miniverl.sub") is False  # find_spec raises here
    assert sys.modules.get("no_such_module_for_miniverl") is None


def test_the_result_and_verl_exporters_import_light() -> None:
    """``miniverl export`` (result.json) and ``export-verl`` read and write JSON / YAML only."""
    proc = run_python(
        "import sys, miniverl.export.result, miniverl.lab.verl.export\n"
        "print(sorted(m for m in ('torch', 'numpy', 'transformers', 'safetensors') if m in sys.modules))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
