"""The layer rules of docs/design.md §2, checked on the import graph of ``src/miniverl``.

Every ``import`` / ``from ... import`` in every module is parsed with ``ast`` (module
level, function level and ``TYPE_CHECKING`` blocks alike), resolved to an absolute
module name, and checked against the rules below. Also: nothing in ``src`` can execute
code while loading data (no pickle, ``torch.load``, ``eval``/``exec``, unsafe YAML).
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import SRC_DIR

PACKAGE_ROOT = SRC_DIR / "miniverl"

FOUNDATION = {"<root>", "errors", "utils", "config"}
CONTRACTS = {"schemas", "environments"}
SURFACES = {"reporting", "evaluation", "inspection", "cli"}
HIGHER_THAN_OBJECTIVE = {"agent", "models", "teachers", "cache", "training"} | SURFACES
TORCH_FREE_MODULES_PREFIXES = (
    "miniverl.errors",
    "miniverl.utils",
    "miniverl.config",
    "miniverl.schemas",
    "miniverl.environments",
    "miniverl.agent",
    "miniverl.trajectory",
    "miniverl.selection",
    "miniverl.inspection",
    "miniverl.cli",
    "miniverl.models.base",
    "miniverl.models.tokenizers",
)
# docs/design.md §2.2: models/fitting.py imports the objective inside cross_entropy_fit_step,
# function-locally (the one fit step of the toy teacher and the HF teacher adapter).
LOCAL_IMPORT_EXCEPTIONS = {
    ("miniverl.models.fitting", "cross_entropy_fit_step"): {"losses", "trajectory", "selection"}
}


@dataclass(frozen=True)
class ImportEdge:
    importer: str  # dotted module name
    imported: str  # dotted module name (absolute)
    functions: tuple[str, ...]  # enclosing functions, outermost first; () at module/class level
    type_checking: bool
    lineno: int

    @property
    def function(self) -> str | None:
        return self.functions[-1] if self.functions else None

    @property
    def where(self) -> str:
        scope = f" in {'.'.join(self.functions)}()" if self.functions else ""
        return f"{self.importer}:{self.lineno}{scope} imports {self.imported}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC_DIR).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_subpackage(name: str) -> bool:
    return (PACKAGE_ROOT / name / "__init__.py").exists() or (PACKAGE_ROOT / f"{name}.py").exists()


class _Collector(ast.NodeVisitor):
    def __init__(self, path: Path) -> None:
        self.module = _module_name(path)
        self.package = self.module if path.name == "__init__.py" else self.module.rpartition(".")[0]
        self.functions: list[str] = []
        self.type_checking = 0
        self.edges: list[ImportEdge] = []

    def _add(self, imported: str, lineno: int) -> None:
        self.edges.append(
            ImportEdge(self.module, imported, tuple(self.functions), self.type_checking > 0, lineno)
        )

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.type_checking += 1
        for stmt in node.body:
            self.visit(stmt)
        self.type_checking -= 1
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join([*base, node.module] if node.module else base)
        else:
            target = node.module or ""
        if target == "miniverl":  # "from miniverl import training" imports a subpackage
            subpackages = [a.name for a in node.names if _is_subpackage(a.name)]
            for name in subpackages:
                self._add(f"miniverl.{name}", node.lineno)
            if len(subpackages) == len(node.names):
                return
        self._add(target, node.lineno)


def _edges(path: Path) -> list[ImportEdge]:
    collector = _Collector(path)
    collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return collector.edges


def _layer(module: str) -> str | None:
    """First component below ``miniverl`` ("<root>" for the package itself); None if external."""
    if module == "miniverl":
        return "<root>"
    if not module.startswith("miniverl."):
        return None
    return module.split(".")[1]


MODULE_FILES = sorted(PACKAGE_ROOT.rglob("*.py"))
ALL_EDGES = [edge for path in MODULE_FILES for edge in _edges(path)]


def _exception_allows(edge: ImportEdge, layer: str) -> bool:
    return any(
        edge.importer == module and function in edge.functions and layer in layers
        for (module, function), layers in LOCAL_IMPORT_EXCEPTIONS.items()
    )


def _violations(
    importer_layers: set[str], allowed: set[str] | None = None, forbidden: set[str] | None = None
) -> list[str]:
    bad = []
    for edge in ALL_EDGES:
        src, dst = _layer(edge.importer), _layer(edge.imported)
        if src not in importer_layers or dst is None or dst == src or _exception_allows(edge, dst):
            continue
        if (allowed is not None and dst not in allowed) or (
            forbidden is not None and dst in forbidden
        ):
            bad.append(edge.where)
    return bad


def test_the_parser_sees_the_tree() -> None:
    modules = {_module_name(p) for p in MODULE_FILES}
    assert {
        "miniverl.errors",
        "miniverl.schemas.trajectory",
        "miniverl.cli.main",
        "miniverl.agent.loop",
    } <= modules
    edges = {(e.importer, e.imported) for e in ALL_EDGES}
    assert ("miniverl.trajectory.alignment", "miniverl.trajectory.masks") in edges
    loop_models = [
        e
        for e in ALL_EDGES
        if e.importer == "miniverl.agent.loop" and e.imported == "miniverl.models.base"
    ]
    assert loop_models and all(e.type_checking for e in loop_models)
    cli_local = [
        e
        for e in ALL_EDGES
        if e.importer == "miniverl.cli.main" and e.imported == "miniverl.config.models"
    ]
    assert cli_local and all(e.functions for e in cli_local)
    assert any(e.functions == ("validate",) for e in cli_local)


def test_foundation_imports_nothing_higher() -> None:
    assert _violations({"errors", "utils", "config"}, allowed=FOUNDATION) == []


def test_contracts_import_only_foundation() -> None:
    assert _violations(CONTRACTS, allowed=FOUNDATION | CONTRACTS) == []


def test_objective_layer_does_not_import_execution_or_above() -> None:
    assert _violations({"trajectory", "selection", "losses"}, forbidden=HIGHER_THAN_OBJECTIVE) == []


def test_execution_layer_does_not_import_supervision_or_above() -> None:
    forbidden = {"teachers", "cache", "training"} | SURFACES
    assert _violations({"agent", "models"}, forbidden=forbidden) == []
    # models reaches the objective layer only inside cross_entropy_fit_step (docs/design.md §2.2).
    assert _violations({"models"}, forbidden={"losses", "trajectory", "selection"}) == []


def test_supervision_does_not_import_training() -> None:
    assert _violations({"teachers", "cache"}, forbidden={"training"} | SURFACES) == []


def test_only_orchestration_and_surfaces_import_training() -> None:
    others = {_layer(_module_name(p)) for p in MODULE_FILES} - {
        "cli",
        "training",
        "evaluation",
        "reporting",
    }
    assert _violations(others, forbidden={"training"}) == []


def test_cli_imports_heavy_layers_only_inside_commands() -> None:
    heavy = {"models", "losses", "teachers", "training", "agent"}
    bad = [
        e.where
        for e in ALL_EDGES
        if _layer(e.importer) == "cli" and not e.functions and _layer(e.imported) in heavy
    ]
    assert bad == []


def test_inspection_stays_torch_free() -> None:
    assert (
        _violations(
            {"inspection"}, forbidden={"models", "losses", "teachers", "training", "evaluation"}
        )
        == []
    )


def test_torch_free_modules_do_not_import_torch_at_module_level() -> None:
    bad = [
        e.where
        for e in ALL_EDGES
        if e.importer.startswith(TORCH_FREE_MODULES_PREFIXES)
        and not e.functions
        and not e.type_checking
        and (e.imported == "torch" or e.imported.startswith("torch."))
    ]
    assert bad == []


# -- nothing in src executes code while loading data -------------------------------------------


@functools.cache
def _code_only(path: Path) -> str:
    """The source with comments and string literals blanked out (docstrings say 'no pickle')."""
    out = []
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    for tok in tokens:
        if tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(
            tokenize, "FSTRING_MIDDLE", -1
        ):
            continue
        out.append(tok.string)
        out.append(" ")
    return re.sub(r"\s*\.\s*", ".", "".join(out))  # "model . eval" -> "model.eval"


FORBIDDEN_PATTERNS = {
    "pickle": re.compile(r"\b(c?pickle|cloudpickle|dill|shelve)\b"),
    "torch.load": re.compile(r"\btorch\s*\.\s*load\b"),
    "torch.save": re.compile(r"\btorch\s*\.\s*save\b"),
    "bare eval(": re.compile(r"(?<![\w.])eval\s*\("),
    "bare exec(": re.compile(r"(?<![\w.])exec\s*\("),
    "unsafe yaml": re.compile(r"\byaml\s*\.\s*(load|unsafe_load|full_load|load_all)\s*\("),
    "remote code": re.compile(r"trust_remote_code\s*=\s*True"),
}


@pytest.mark.parametrize("name", list(FORBIDDEN_PATTERNS))
def test_no_code_executing_loaders(name: str) -> None:
    pattern = FORBIDDEN_PATTERNS[name]
    hits = []
    for path in MODULE_FILES:
        code = _code_only(path)
        code = re.sub(r"\bdef\s+(eval|exec)\s*\(", "def _(", code)  # a method *named* eval is fine
        if pattern.search(code):
            hits.append(str(path.relative_to(SRC_DIR)))
    assert hits == []


def test_forbidden_patterns_do_catch_what_they_should() -> None:
    samples = {
        "pickle": "import pickle",
        "torch.load": "x = torch.load(f)",
        "torch.save": "torch . save(x, f)",
        "bare eval(": "y = eval(s)",
        "bare exec(": "exec (code)",
        "unsafe yaml": "yaml.load(text)",
        "remote code": "f(trust_remote_code=True)",
    }
    for name, sample in samples.items():
        assert FORBIDDEN_PATTERNS[name].search(sample), name
    for harmless in (
        "model.eval()",
        "self.eval(x)",
        "module.exec_module(m)",
        "yaml.safe_load(t)",
        "evaluate(x)",
    ):
        assert not any(p.search(harmless) for p in FORBIDDEN_PATTERNS.values()), harmless


def test_no_dangerous_imports_or_calls() -> None:
    bad = []
    for path in MODULE_FILES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"eval", "exec", "__import__"}
            ):
                bad.append(f"{path.name}:{node.lineno} calls {node.func.id}")
            if isinstance(node, ast.ImportFrom) and node.module == "torch":
                bad += [
                    f"{path.name}:{node.lineno} imports torch.{a.name}"
                    for a in node.names
                    if a.name in {"load", "save"}
                ]
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                bad += [
                    f"{path.name}:{node.lineno} imports {n}"
                    for n in names
                    if n.split(".")[0] in {"pickle", "dill", "shelve", "marshal"}
                ]
    assert bad == []
