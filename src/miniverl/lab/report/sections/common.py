"""Facts derived from a run that several sections show (evaluations by stage, step count)."""

from __future__ import annotations

from typing import Any

from miniverl.inspection.run_dir import RunData
from miniverl.lab.report.tables import STAGE_ORDER


def collect_evaluations(data: RunData) -> dict[str, dict[str, Any]]:
    """Every held-out evaluation in stage order, each tagged with the file it came from.

    ``eval.json`` wins over the metrics records of the same tag; an ``eval.<tag>.json``
    re-evaluation whose tag collides with a training stage is listed under its file name.
    """
    found: dict[str, dict[str, Any]] = {}
    for record in data.evals:
        if record.get("tag"):
            found[str(record["tag"])] = {**record, "source": data.paths.metrics.name}
    if data.eval_summary:
        for tag, record in (data.eval_summary.get("evaluations") or {}).items():
            if isinstance(record, dict):
                found[tag] = {**record, "source": data.paths.eval_json.name}
    for tag, record in data.eval_tags.items():
        name = data.paths.eval_tag_json(tag).name
        found[tag if tag not in found else name] = {**record, "source": name}
    ordered = {tag: found[tag] for tag in STAGE_ORDER if tag in found}
    ordered.update({tag: rec for tag, rec in found.items() if tag not in ordered})
    return ordered


def optimizer_steps(data: RunData) -> int | None:
    if data.eval_summary and isinstance(data.eval_summary.get("global_optimizer_step"), int):
        return int(data.eval_summary["global_optimizer_step"])
    committed = [s.get("global_optimizer_step") for s in data.steps if s.get("committed", True)]
    numbers = [c for c in committed if isinstance(c, int)]
    if numbers:
        return max(numbers)
    if data.manifest and isinstance(data.manifest.get("global_optimizer_step"), int):
        return int(data.manifest["global_optimizer_step"])
    return None
