"""One test per user-visible behaviour of the smaller CLI conveniences."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import interrupt_cycle, tiny_config
from miniverl.cli.main import app
from miniverl.lab.demo import check_shared_start, comparison_run_dir
from miniverl.trajectory.io import read_trajectories, write_trajectories
from miniverl.utils.runs import RunPaths

runner = CliRunner()


def _invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


@pytest.mark.slow
def test_resume_reuses_the_stored_overrides_and_the_hint_is_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(tiny_config().to_yaml())
    run = tmp_path / "run"
    with monkeypatch.context() as m:
        interrupt_cycle(m, 0, before_checkpoint=False)
        code, out = _invoke(
            "train", str(recipe), "train.cycles=3", "loss.divergence=reverse_kl",
            "--output", str(run), "--quiet", "--no-report",
        )  # fmt: skip
    assert code == 130, out
    hint = f"miniverl train {recipe} --output {run} --resume"
    assert hint in " ".join(out.split())

    saved = (run / "command.json").read_text()
    code, out = _invoke(*hint.split()[1:], "--quiet", "--no-report")
    assert code == 0, out
    assert "reusing the stored overrides train.cycles=3 loss.divergence=reverse_kl" in out
    assert RunPaths(run).final_checkpoint.is_dir()

    # Without the stored overrides the same command is refused (the config digest differs).
    shutil.rmtree(run / "checkpoints" / "final")
    (run / "command.json").unlink()
    code, out = _invoke(*hint.split()[1:], "--quiet", "--no-report")
    assert code == 1 and "different config" in out
    assert "train.cycles=3" in saved


def test_eval_on_an_empty_split_is_an_error(demo_fast_run: Path) -> None:
    code, out = _invoke("eval", "--run", str(demo_fast_run), "--split", "test", "--quiet")
    assert code == 1
    assert "'test' split" in out and "is empty" in out and "0/0" not in out


def test_eval_prints_its_result_once_naming_checkpoint_and_split(
    demo_fast_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(demo_fast_run, run)
    code, out = _invoke("eval", "--run", str(run), "--tag", "once")
    assert code == 0, out
    result = json.loads((run / "eval.once.json").read_text())
    text = " ".join(out.split())
    assert text.count(f"{result['solved']}/{result['tasks']} solved") == 1, out
    assert (
        f"once: {result['solved']}/{result['tasks']} solved "
        f"({100 * result['success_rate']:.1f}%) on the eval split, checkpoint final -> "
        f"{run / 'eval.once.json'}"
    ) in text, out


def test_a_missing_checkpoint_is_called_missing(demo_fast_run: Path) -> None:
    code, out = _invoke("eval", "--run", str(demo_fast_run), "--checkpoint", "cycle-9999")
    assert code == 1
    text = " ".join(out.split())
    assert "cycle-9999 is missing" in text and "incomplete" not in text
    assert "available checkpoints:" in text and "final" in text


def test_inspect_summarizes_hundreds_of_policy_versions(
    demo_fast_run: Path, tmp_path: Path
) -> None:
    base = read_trajectories(RunPaths(demo_fast_run).trajectories)[0]
    many = [
        base.model_copy(update={"trajectory_id": f"t{v}", "policy_version": v}) for v in range(300)
    ]
    path = tmp_path / "many.jsonl"
    write_trajectories(path, many)
    code, out = _invoke("inspect", str(path), "--limit", "0")
    assert code == 0, out
    assert "policy versions 300 distinct: 0-299" in out
    assert "150, 151" not in out
    code, out = _invoke("inspect", str(path), "--limit", "0", "--all-versions")
    assert code == 0 and "150, 151" in out


@pytest.mark.slow
def test_second_demo_needs_overwrite_and_fast_says_smoke_test(
    demo_fast_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "demo"
    shutil.copytree(demo_fast_run, run)
    code, out = _invoke("demo", "--fast", "--output", str(run), "--quiet")
    assert code == 1
    assert "already holds a demo run" in out and "--overwrite" in out

    (run / "sentinel").write_text("old run")
    code, out = _invoke(
        "demo", "--fast", "--output", str(run), "--quiet", "--no-report", "--overwrite"
    )
    assert code == 0, out
    assert not (run / "sentinel").exists() and RunPaths(run).final_checkpoint.is_dir()
    assert "SMOKE TEST (demo --fast)" in out and "meaningless" in out
    comparison = json.loads(RunPaths(run).comparison_json.read_text())
    rate = comparison["recovery"]["teacher_solved"] / comparison["recovery"]["tasks"]
    assert "teacher (the ceiling)" in out and f"{100 * rate:.1f}%" in out
    assert "OPD " not in out  # the smoke test states no outcome
    # both arms ran, from the same warm-up weights, and are printed side by side
    arm = comparison_run_dir(run)
    assert RunPaths(arm).final_checkpoint.is_dir()
    assert check_shared_start({"opd": run, "offline_kd": arm}) is not None
    assert [a["name"] for a in comparison["arms"]] == ["opd", "offline_kd"]
    for record, directory in zip(comparison["arms"], (run, arm), strict=True):
        evals = {
            r["tag"]: r
            for r in map(json.loads, RunPaths(directory).metrics.read_text().splitlines())
            if r.get("kind") == "eval"
        }
        # update 0 is the shared warm-up's (the loaded cold start's baseline), then every
        # cycle's (eval.every=1), the last one the final (2 cycles)
        assert record["curve"] == [
            [0, evals["baseline"]["success_rate"]],
            [1, evals["cycle-0000"]["success_rate"]],
            [2, evals["final"]["success_rate"]],
        ]
        assert record["run_dir"] == str(directory)
    assert comparison["sentence"] is None and comparison["smoke_test"] is True
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert [r for r in rows if r] == [
        "SFT warm-up (shared start)",
        "opd",
        "offline_kd",
        "teacher (the ceiling)",
    ], out

    stranger = tmp_path / "not-a-run"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("keep me")
    code, out = _invoke("demo", "--fast", "--output", str(stranger), "--overwrite")
    assert code == 1 and "not a miniverl run directory" in out
    assert (stranger / "notes.txt").read_text() == "keep me"
