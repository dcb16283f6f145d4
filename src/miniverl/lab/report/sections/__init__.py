"""Report sections: each builder turns :class:`~miniverl.inspection.run_dir.RunData` into one
:class:`~miniverl.lab.report.tables.Section`; :func:`build_sections` lists them in reading order.
"""

from __future__ import annotations

from miniverl.inspection.run_dir import RunData
from miniverl.lab.report.sections.benchmark import benchmark_sections
from miniverl.lab.report.sections.common import collect_evaluations
from miniverl.lab.report.sections.curves import curves_section, failures_section, success_section
from miniverl.lab.report.sections.headline import headline_section
from miniverl.lab.report.sections.resources import memory_section, selection_section
from miniverl.lab.report.sections.run import events_section, identity_section, objective_section
from miniverl.lab.report.sections.tokens import entropy_section, provenance_section, tokens_section
from miniverl.lab.report.tables import Section


def build_sections(data: RunData) -> list[Section]:
    """Every section the directory supports, in reading order."""
    evaluations = collect_evaluations(data) if data.is_training_run else None
    sections: list[Section] = [headline_section(data, evaluations)]
    if evaluations is not None:
        sections += [
            identity_section(data),
            objective_section(data),
            curves_section(data, evaluations),
            success_section(data, evaluations),
            failures_section(data, evaluations),
            provenance_section(data),
            tokens_section(data),
            entropy_section(data),
            selection_section(data),
            memory_section(data),
        ]
    if data.benchmark is not None:
        sections += benchmark_sections(data.benchmark)
    if data.is_training_run:
        sections.append(events_section(data))
    return sections


__all__ = ["build_sections"]
