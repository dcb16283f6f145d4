"""No module under ``src/`` is longer than ~600 lines unless its opening comment says why.

A long file is a sign that two ideas share one home. A module whose size
is essential says so with a ``# Size:`` line (or ``Size:`` in its docstring) within its
first 10 lines, giving the reason; the check then accepts it.
"""

from __future__ import annotations

from pathlib import Path

from helpers import SRC_DIR

MAX_LINES = 600
MARKER = "Size:"
HEAD_LINES = 10


def oversized(root: Path) -> list[str]:
    """``"<path>: <n> lines"`` for every ``*.py`` under ``root`` over the limit, unjustified."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) <= MAX_LINES:
            continue
        if any(MARKER in line for line in lines[:HEAD_LINES]):
            continue
        bad.append(f"{path.relative_to(root)}: {len(lines)} lines")
    return bad


def test_no_module_in_src_is_over_600_lines_without_a_size_note() -> None:
    assert oversized(SRC_DIR) == []


def test_the_size_check_flags_a_long_module_and_accepts_a_justified_one(tmp_path: Path) -> None:
    body = "x = 1\n" * MAX_LINES
    (tmp_path / "short.py").write_text(body, encoding="utf-8")
    (tmp_path / "long.py").write_text(body + "y = 2\n", encoding="utf-8")
    late = '"""Doc."""\n' + "\n" * HEAD_LINES + "# Size: too late to count\n" + body
    (tmp_path / "late.py").write_text(late, encoding="utf-8")
    justified = '"""A table.\n\nSize: one rule per recipe key.\n"""\n' + body
    (tmp_path / "justified.py").write_text(justified, encoding="utf-8")
    assert oversized(tmp_path) == [
        f"late.py: {MAX_LINES + HEAD_LINES + 2} lines",
        f"long.py: {MAX_LINES + 1} lines",
    ]
