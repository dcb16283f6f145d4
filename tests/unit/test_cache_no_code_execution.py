"""Nothing in miniverl can execute code while loading data: safetensors + JSON only.

The scan is a grep over the *code* of every module: string literals and comments are
dropped with :mod:`tokenize` first, so a docstring saying which formats are avoided does not
count, while any use of one (an import, an attribute, a call, an alias) does.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "miniverl"

FORBIDDEN = {
    "pickle (any spelling, incl. cPickle and allow_pickle)": re.compile(r"pickle", re.IGNORECASE),
    "torch.load": re.compile(r"\btorch\s*\.\s*load\b"),
    "load imported from torch": re.compile(r"\bfrom\s+torch(\.\w+)*\s+import\b[^\n]*\bload\b"),
    "bare eval(": re.compile(r"(?<![\w.])eval\s*\("),
    "bare exec(": re.compile(r"(?<![\w.])exec\s*\("),
    "dill / marshal / shelve / joblib": re.compile(r"\b(dill|marshal|shelve|joblib)\b"),
}


def code_only(source: str) -> str:
    """``source`` with every string literal and comment blanked to spaces, layout kept."""
    dropped = {tokenize.COMMENT, tokenize.STRING}
    for name in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END"):
        if hasattr(tokenize, name):
            dropped.add(getattr(tokenize, name))
    lines = [list(line) for line in source.splitlines(keepends=True)]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in dropped:
            continue
        (row, col), (end_row, end_col) = token.start, token.end
        for r in range(row, end_row + 1):
            line = lines[r - 1]
            stop = end_col if r == end_row else len(line)
            for c in range(col if r == row else 0, stop):
                if line[c] != "\n":
                    line[c] = " "
    return "".join("".join(line) for line in lines)


def violations(source: str) -> list[str]:
    code = re.sub(r"\bdef\s+(eval|exec)\s*\(", "def _(", code_only(source))
    return [label for label, pattern in FORBIDDEN.items() if pattern.search(code)]


def test_the_scanner_catches_uses_and_ignores_mentions() -> None:
    assert violations("import pickle\n") == [
        "pickle (any spelling, incl. cPickle and allow_pickle)"
    ]
    assert violations("import numpy as np\nnp.load(f, allow_pickle=True)\n")
    assert violations("state = torch.load(path)\n") == ["torch.load"]
    assert violations("from torch import load as l\n") == ["load imported from torch"]
    assert violations("value = eval(text)\n") == ["bare eval("]
    assert violations("exec (code)\n") == ["bare exec("]
    assert violations("import marshal\n")
    assert (
        violations('"""no pickle, never torch.load or eval(x)"""\nmodel.eval()\n# exec(x)\n') == []
    )
    assert violations("def set_eval(x): ...\nself.exec_count = 1\nf'no pickle {x}'\n") == []
    assert violations("class M:\n    def eval(self): ...\n") == []


def test_no_module_of_the_package_can_execute_code_on_load() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in files
        if (hits := violations(path.read_text(encoding="utf-8")))
    }
    assert found == {}, f"code-executing deserialization or evaluation in: {found}"
