"""``miniverl teacher-audit``: the run's teacher re-scores the student's stored rollouts.

Checked by values on one short OPD run of a student that errs often: the audit's classes
partition exactly the model positions of the student's training rollouts; the oracle teacher
agrees with the oracle's label everywhere one exists; it targets EOS nowhere; and with the EOS
fallback put back into the oracle the same audit counts EOS targets (so the count can fail).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import tiny_config
from miniverl.cli.main import app
from miniverl.lab.run import start_run
from miniverl.lab.teachers import oracle
from miniverl.lab.teachers.audit import CLASSES, student_rollouts
from miniverl.utils.runs import RunPaths

CHAIN = (
    "environment.name=calc_chain",
    "environment.difficulty=mixed",
    "environment.params.train_k=[1,2,3]",
    "environment.params.eval_k=[1,2,3]",
    "environment.params.test_k=[1]",
    "environment.params.checked=true",
    "rollout.max_turns=6",
    "rollout.max_new_tokens_per_turn=40",
    "rollout.max_total_tokens=700",
    "rollout.max_parse_errors=3",
    "models.oracle_teacher.smoothing=0.001",
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("audit") / "run"
    config = tiny_config(
        "run.mode=opd", "rollout.temperature=1.5", "train.rollouts_per_cycle=4", *CHAIN
    )
    start_run(config, output_dir=root).train()
    return root


def _audit(run_dir: Path, *args: str) -> dict:
    result = CliRunner().invoke(app, ["teacher-audit", str(run_dir), "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_the_classes_partition_the_student_positions_and_the_oracle_never_targets_eos(
    run_dir: Path,
) -> None:
    audit = _audit(run_dir)
    rollouts = student_rollouts(RunPaths(run_dir).trajectories)
    positions = sum(s.length for t in rollouts for s in t.spans if s.is_model_generated)
    classes = audit["classes"]
    assert audit["trajectories"] == len(rollouts) == 8
    assert sum(classes[c]["positions"] for c in CLASSES) == positions
    assert audit["eos_targets"] == 0
    for name in ("on_path", "after_error"):
        assert classes[name]["targeted"] == classes[name]["positions"]  # all defined
        assert classes[name]["labelled"] > 0
        assert classes[name]["agreement"] == 1.0
    assert classes["deviated"]["positions"] > 0  # a hot student leaves the path
    assert classes["after_error"]["positions"] > 0  # and the checked tool flags it
    assert classes["deviated"]["labelled"] == 0


def test_the_eos_fallback_is_counted_when_put_back(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    defined = oracle.OracleTeacher.next_token_ids

    def with_fallback(self, token_ids, positions):  # type: ignore[no-untyped-def]
        eos = self.tokenizer.eos_token_id
        return [eos if t is None else t for t in defined(self, token_ids, positions)]

    monkeypatch.setattr(oracle.OracleTeacher, "next_token_ids", with_fallback)
    audit = _audit(run_dir)
    assert audit["eos_targets"] > 0
    assert audit["classes"]["deviated"]["eos_targets"] == audit["eos_targets"]


def test_cycles_select_rollouts_and_bad_ranges_are_refused(run_dir: Path) -> None:
    assert _audit(run_dir, "--cycles", "1")["trajectories"] == 4
    result = CliRunner().invoke(app, ["teacher-audit", str(run_dir), "--cycles", "5-2"])
    assert result.exit_code == 1
    assert "--cycles '5-2' ends before it starts" in result.output
    result = CliRunner().invoke(app, ["teacher-audit", str(run_dir), "--cycles", "9"])
    assert result.exit_code == 1 and "holds no student rollouts in cycles 9" in result.output
    text = CliRunner().invoke(app, ["teacher-audit", str(run_dir)])
    assert text.exit_code == 0 and "after_error" in text.output and "EOS 0" in text.output
