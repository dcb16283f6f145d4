"""Documentation the code cites exists, and its worked examples are the ones the tests run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import SRC_DIR

REPO = SRC_DIR.parent
DOC_PATH = re.compile(r"(?<![\w/.-])((?:docs|examples|recipes|benchmarks)/[\w./-]*\w)")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
DESIGN_SECTION = re.compile(r"docs/design\.md((?:,? ?§\d+(?:\.\d+)?(?: and| ,)?)+)")
RETIRED = ("design.txt", "trajectory-schema.txt", "math.md", "shared/spec")


def _sources() -> list[Path]:
    return [*sorted((SRC_DIR / "miniverl").rglob("*.py")), REPO / "README.md"]


def _cited_paths(text: str) -> set[str]:
    return {m.rstrip(".") for m in DOC_PATH.findall(text)}


def test_every_repository_path_cited_in_src_and_readme_exists() -> None:
    missing = []
    for source in _sources():
        for cited in _cited_paths(source.read_text(encoding="utf-8")):
            if not (REPO / cited).exists():
                missing.append(f"{source.relative_to(REPO)} cites {cited}")
    assert not missing, "\n".join(missing)
    cited = set().union(*(_cited_paths(s.read_text(encoding="utf-8")) for s in _sources()))
    assert {"docs/design.md", "docs/objectives.md", "docs/trajectory-schema.md"} <= cited


def test_relative_links_in_readme_and_docs_resolve() -> None:
    broken = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in MD_LINK.findall(doc.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
    assert not broken, "\n".join(broken)


def test_cited_design_sections_exist() -> None:
    headings = set(
        re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", (REPO / "docs" / "design.md").read_text(), re.M)
    )
    assert {"1", "2.1", "3.7", "5.3", "9"} <= headings
    cited: set[str] = set()
    for source in [*_sources(), *sorted((REPO / "tests").rglob("*.py"))]:
        for group in DESIGN_SECTION.findall(source.read_text(encoding="utf-8")):
            cited |= set(re.findall(r"§(\d+(?:\.\d+)?)", group))
    assert cited and cited <= headings, sorted(cited - headings)


@pytest.mark.parametrize("folder", ["src", "tests", "docs"])
def test_no_citation_of_the_out_of_repository_spec(folder: str) -> None:
    files = [REPO / "README.md"] if folder == "docs" else []
    files += [p for p in (REPO / folder).rglob("*") if p.suffix in {".py", ".md"}]
    offenders = [
        f"{p.relative_to(REPO)}: {name}"
        for p in files
        if p.name != "test_docs.py"
        for name in RETIRED
        if name in p.read_text(encoding="utf-8")
    ]
    bare = [
        str(p.relative_to(REPO))
        for p in files
        if re.search(r"(?<![\w/])objectives\.md", p.read_text(encoding="utf-8"))
        and p.parent.name != "docs"
    ]
    assert not offenders and not bare, offenders + bare


def _fenced(markdown: str, after: str, lang: str) -> str:
    tail = markdown[markdown.index(after) :]
    match = re.search(rf"```{lang}\n(.*?)```", tail, re.S)
    assert match is not None
    return match.group(1)


def test_the_design_worked_example_is_the_tested_one_and_prints_what_it_says() -> None:
    import test_rollout_runner as runner_tests

    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    code = _fenced(design, "## 9. Reading order", "python")
    assert code.strip() == runner_tests.DESIGN_EXAMPLE.strip()
    printed = _fenced(design, "Output on the development machine", "text").strip().splitlines()
    assert printed == runner_tests._example_output()


def test_no_set_option_is_cited() -> None:
    """Overrides are positional ``key=value`` arguments after the recipe; ``train`` has no
    ``--set`` option, so no recipe comment or page may tell anyone to pass one."""
    from typer.testing import CliRunner

    from miniverl.cli.main import app

    assert "--set" not in CliRunner().invoke(app, ["train", "--help"]).output
    files = [REPO / "README.md", *(REPO / "docs").rglob("*.md")]
    for folder in ("recipes", "examples", "src"):
        files += [p for p in (REPO / folder).rglob("*") if p.suffix in {".py", ".md", ".yaml"}]
    offenders = [
        str(p.relative_to(REPO))
        for p in files
        if re.search(r"--set\b", p.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_the_readme_is_a_first_screen_and_draws_nothing_from_the_withdrawn_teacher() -> None:
    """At most 200 lines, newcomer first; statistics and history live in docs/benchmark.md and
    results/*/LOG.md. No conclusion drawn from the oracle with the withdrawn stop targets."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    flat = " ".join(readme.split())
    for withdrawn in ("with realisable targets", "loses to off-policy KD", "collapses;"):
        assert withdrawn not in flat, withdrawn
    assert "withdrawn" in flat and "teacher-audit" in flat
    headings = re.findall(r"^## (.+)$", readme, re.M)
    assert headings[:3] == [
        "What OPD has done in this lab so far",
        "Quick start (a fresh Linux laptop, CPU only)",
        "The demo",
    ]
