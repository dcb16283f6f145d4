"""Typed run records (``schemas/records.py``) and the one run-directory reader (``inspection/run_dir.py``)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from test_report import _cycle, _eval, _step, build_run

from helpers import SRC_DIR
from miniverl.errors import CheckpointError, RunDirectoryError
from miniverl.inspection.run_dir import (
    load_run,
    read_events,
    read_json_or_none,
    read_jsonl,
    read_metrics,
)
from miniverl.schemas.records import (
    EVENT_NAMES,
    CheckpointState,
    CycleRecord,
    EvalRecord,
    EventRecord,
    OtherMetricRecord,
    StepRecord,
    parse_event,
    parse_metric,
    parse_state,
)
from miniverl.utils.io import append_jsonl
from miniverl.utils.logging import EventLog
from miniverl.utils.runs import RunPaths

FULL_STEP: dict[str, Any] = {
    **_step(2, "opd", 0, 1.25, teacher=True),
    "policy_fingerprint": "ab" * 8,
    "rollout_policy_fingerprint": "cd" * 8,
    "teacher_entropy_is_lower_bound": False,
    "sampling_temperature": 1.0,
    "loss_temperature": 1,
    "grad_norm": 3,  # an int stays an int: "3" and "3.0000" render differently
}
FULL_CYCLE: dict[str, Any] = {
    **_cycle(1, "opd", 0.5),
    "policy_fingerprint_before": "ab" * 8,
    "policy_fingerprint": "cd" * 8,
    "sampling_temperature": 1.0,
    "loss_temperature": 1.0,
    "mean_loss": 0.5,
    "mean_divergence": None,
}
FULL_EVAL: dict[str, Any] = {**_eval("final", 3, 3), "cycle": 1}
STATE: dict[str, Any] = {
    "cycle": 1, "global_step": 3, "parameter_version": 3, "rollout_policy_version": 2, "task_cursor": 4,
    "chunk_size": 1024, "schedule": {"kind": "constant"}, "main_start_step": 1, "rng": {"python": [3, [1] * 624 + [624], None]},
    "optimizer": {"kind": "adamw"}, "eval_results": {}, "jsonl_sizes": {"metrics": 10, "events": 0},
    "offline_kd": {"pool": [], "version": None, "cursor": 0}, "teacher": None, "miniverl_version": "0.3.0",
    "config_digest": "ef" * 32,
}  # fmt: skip


def _wire(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True)


# ---------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    ("raw", "model"),
    [(FULL_STEP, StepRecord), (FULL_CYCLE, CycleRecord), (FULL_EVAL, EvalRecord)],
    ids=["step", "cycle", "eval"],
)
def test_metric_records_round_trip_byte_identically(raw: dict[str, Any], model: type) -> None:
    record = parse_metric(json.loads(json.dumps(raw)), "metrics.jsonl:1")
    assert type(record) is model
    assert _wire(record.to_json()) == _wire(raw)
    # every key the writers set today is a declared field (extras are for other versions)
    assert set(raw) <= set(model.model_fields)
    again = parse_metric(json.loads(_wire(record.to_json())), "metrics.jsonl:1")
    assert again == record


def test_typed_fields_are_typed() -> None:
    step = parse_metric(dict(FULL_STEP), "x")
    assert isinstance(step, StepRecord)
    assert step.loss == 1.25 and step.grad_norm == 3 and type(step.grad_norm) is int
    assert step.committed is True and step.loss_by_span_type == {
        "assistant_tool_call": 0.9375,
        "assistant_final": 0.3125,
    }


def test_event_and_state_round_trip() -> None:
    raw = {"event": "checkpoint_saved", "time": "2026-01-01T00:00:00+00:00", "monotonic_s": 1.5,
           "name": "cycle-0001", "cycle": 1, "global_optimizer_step": 3}  # fmt: skip
    event = parse_event(raw, "events.jsonl:1")
    assert event.event == "checkpoint_saved" and event.known and event["name"] == "cycle-0001"
    assert _wire(event.to_json()) == _wire(raw)
    state = parse_state(STATE, "state.json")
    assert state.task_cursor == 4 and state.jsonl_sizes == {"metrics": 10, "events": 0}
    assert _wire(state.to_json()) == _wire(STATE)


def test_event_log_writes_what_the_reader_types(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    log.emit("run_start", mode="opd")
    log.emit("some_future_event", detail=1)
    events = read_events(tmp_path / "events.jsonl")
    assert [e.event for e in events] == ["run_start", "some_future_event"]
    assert events[0].known and not events[1].known and events[1]["detail"] == 1
    assert isinstance(events[0].time, str) and isinstance(events[0].monotonic_s, float)


def test_every_emitted_event_name_is_declared() -> None:
    """``EVENT_NAMES`` lists every literal name passed to ``.emit(`` in src/."""
    emitted: set[str] = set()
    for path in (SRC_DIR / "miniverl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "emit"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                emitted.add(node.args[0].value)
    assert emitted and emitted <= EVENT_NAMES, sorted(emitted - EVENT_NAMES)


# ---------------------------------------------------------------------- compatibility policy


def test_old_records_with_fewer_keys_and_unknown_keys_stay_readable() -> None:
    old = {"kind": "step", "phase": "sft", "loss": 2.0, "legacy_metric": [1, 2]}
    record = parse_metric(old, "metrics.jsonl:1")
    assert isinstance(record, StepRecord)
    assert (
        record.policy_fingerprint is None and record.get("policy_fingerprint", "absent") == "absent"
    )
    assert "legacy_metric" in record and record["legacy_metric"] == [1, 2]
    assert "policy_fingerprint" not in record
    assert record.to_json() == old  # nothing added, nothing dropped
    assert {**record} == old
    unknown = parse_metric({"kind": "probe", "x": 1}, "metrics.jsonl:2")
    assert type(unknown) is OtherMetricRecord and unknown.to_json() == {"kind": "probe", "x": 1}


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        ({"kind": "step", "loss": "1.5"}, "loss", "Input should be a number, got str"),
        ({"kind": "step", "lr": True}, "lr", "Input should be a number, got bool"),
        ({"kind": "step", "cycle": "3"}, "cycle", "Input should be a valid integer"),
        ({"kind": "cycle", "skipped": "no"}, "skipped", "Input should be a valid boolean"),
        ({"kind": "eval", "termination": {"final_answer": "2"}}, "termination.final_answer", "valid integer"),
        ({"kind": "step", "committed": 1}, "committed", "Input should be a valid boolean"),
    ],
)  # fmt: skip
def test_wrong_typed_field_is_a_run_directory_error_naming_it(
    raw: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(RunDirectoryError) as info:
        parse_metric(raw, "run/metrics.jsonl:7")
    assert type(info.value) is RunDirectoryError
    assert info.value.message.startswith(f"run/metrics.jsonl:7: field {field!r}: ")
    assert message in info.value.message


def test_event_without_a_name_and_non_objects_are_refused() -> None:
    with pytest.raises(RunDirectoryError, match=r"events.jsonl:2: field 'event': Field required"):
        parse_event({"time": "t"}, "events.jsonl:2")
    with pytest.raises(RunDirectoryError, match="must be a JSON object"):
        parse_metric([1], "metrics.jsonl:1")
    with pytest.raises(RunDirectoryError, match=r"state.json: field 'task_cursor'"):
        parse_state({k: v for k, v in STATE.items() if k != "task_cursor"}, "state.json")
    with pytest.raises(
        CheckpointError, match=r"state.json: field 'chunk_size': Input should be a valid integer"
    ):
        parse_state({**STATE, "chunk_size": "1024"}, "state.json", error=CheckpointError)


# ---------------------------------------------------------------------- the reader


def test_torn_last_line_is_ignored_in_metrics_and_events(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    append_jsonl(paths.metrics, [FULL_STEP, FULL_CYCLE])
    append_jsonl(paths.events, [{"event": "run_start"}])
    with open(paths.metrics, "ab") as handle:
        handle.write(b'{"kind": "eval", "tag": "fin')
    with open(paths.events, "ab") as handle:
        handle.write(b'{"event": "run_e')
    metrics = read_metrics(paths.metrics)
    assert [type(r) for r in metrics] == [StepRecord, CycleRecord]
    assert [e.event for e in read_events(paths.events)] == ["run_start"]
    data = load_run(tmp_path)
    assert len(data.steps) == 1 and len(data.cycles) == 1 and data.evals == []


def test_a_corrupt_complete_line_raises_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"kind": "step"}\n{"kind": \n{"kind": "cycle"}\n')
    with pytest.raises(RunDirectoryError) as info:
        read_metrics(path)
    assert f"{path}:2" in info.value.message
    wrong = tmp_path / "m2.jsonl"
    wrong.write_bytes(b'{"kind": "step"}\n{"kind": "step", "loss": "x"}\n')
    with pytest.raises(RunDirectoryError, match=rf"{wrong}:2: field 'loss'"):
        read_metrics(wrong)


def test_missing_optional_files_read_as_empty(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    assert read_metrics(paths.metrics) == [] and read_events(paths.events) == []
    assert read_jsonl(paths.token_analysis) == [] and read_json_or_none(paths.manifest) is None
    append_jsonl(paths.metrics, [FULL_STEP])
    data = load_run(tmp_path)
    assert data.manifest is None and data.events == [] and data.config is None
    assert data.benchmark is None and data.eval_tags == {} and data.token_rows == []
    assert isinstance(data.steps[0], StepRecord) and data.steps[0].loss == 1.25


def test_load_run_types_a_full_run(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run")
    data = load_run(run)
    assert all(isinstance(s, StepRecord) for s in data.steps) and len(data.steps) == 3
    assert all(isinstance(c, CycleRecord) for c in data.cycles) and len(data.cycles) == 2
    assert [e.tag for e in data.evals] == ["baseline", "after_warmup", "final"]
    assert all(isinstance(e, EventRecord) for e in data.events)
    assert data.events[-1].event == "run_end" and data.events[-1]["status"] == "completed"


def test_checkpoint_state_written_by_the_trainer_shape_is_typed() -> None:
    assert CheckpointState.model_fields.keys() >= set(STATE)


# ---------------------------------------------------------------------- one reader

_READ_CALLS = {
    "iter_jsonl",
    "read_jsonl",
    "loads_json",
    "read_regular_bytes",
    "loads",
    "load",
    "open",
}
_READ_METHODS = {"read_text", "read_bytes", "open"}
_RUN_LOGS = {"metrics", "events"}
_LOG_NAMES = ("metrics.jsonl", "events.jsonl")
_READER = SRC_DIR / "miniverl" / "inspection" / "run_dir.py"


def _mentions_run_log(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in _RUN_LOGS:
            return True
        if (
            isinstance(sub, ast.Constant)
            and isinstance(sub.value, str)
            and any(name in sub.value for name in _LOG_NAMES)
        ):
            return True
    return False


def direct_run_log_reads(root: Path) -> list[str]:
    """Calls outside ``inspection/run_dir.py`` that read ``metrics.jsonl`` / ``events.jsonl``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == _READER:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            operands: list[ast.AST] = [*node.args, *(k.value for k in node.keywords)]
            if name in _READ_METHODS and isinstance(func, ast.Attribute):
                operands.append(func.value)
            elif name not in _READ_CALLS:
                continue
            if any(_mentions_run_log(o) for o in operands):
                found.append(f"{path.relative_to(root)}:{node.lineno} {name}()")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in {
                "read_jsonl",
                "read_metrics",
                "read_events",
            }:
                found.append(f"{path.relative_to(root)}:{node.lineno} defines {node.name}")
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1].split()[0])))


def test_only_the_reader_parses_metrics_and_events() -> None:
    assert direct_run_log_reads(SRC_DIR / "miniverl") == []


def test_the_one_reader_check_sees_a_second_parser(tmp_path: Path) -> None:
    (tmp_path / "rogue.py").write_text(
        "import json\n"
        "def steps(paths):\n"
        "    return [json.loads(l) for l in paths.metrics.read_text().splitlines()]\n"
        "def events(root):\n"
        "    return open(root / 'events.jsonl').read()\n"
        "def read_jsonl(p):\n"
        "    return []\n",
        encoding="utf-8",
    )
    assert direct_run_log_reads(tmp_path) == [
        "rogue.py:3 read_text()",
        "rogue.py:5 open()",
        "rogue.py:6 defines read_jsonl",
    ]


def test_writers_build_what_the_reader_accepts() -> None:
    """``build`` validates strictly (as the reader does) and always writes the ``kind``."""
    fields = {k: v for k, v in FULL_STEP.items() if k != "kind"}
    record = StepRecord.build(**fields)
    assert record.to_json() == FULL_STEP
    assert parse_metric(json.loads(_wire(record.to_json())), "m:1") == record
    assert EvalRecord.build(tag="final").to_json() == {"kind": "eval", "tag": "final"}
    assert CycleRecord.build(cycle=0).to_json() == {"kind": "cycle", "cycle": 0}
    with pytest.raises(RuntimeError, match=r"StepRecord being written: field 'step': .*integer"):
        StepRecord.build(step=1.0)
