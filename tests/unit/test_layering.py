"""The layer rules of docs/design.md §2, checked on the import graph of ``src/miniverl``.

Every ``import`` / ``from ... import`` in every module is parsed with ``ast`` (module
level, function level and ``TYPE_CHECKING`` blocks alike), resolved to an absolute
module name, and checked against the rules below: packages follow the layer table, and
no two files import each other, directly or through others (a cycle means neither file
is the lower one, so neither can be read, tested or moved alone). Also: nothing in
``src`` can execute code while loading data (no pickle, ``torch.load``,
``eval``/``exec``, unsafe YAML).
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

# docs/design.md §2: the layers, lowest first, and the arrows between them. A package may
# import any package of a layer its own layer reaches by following the arrows. Every other
# cross-package import -- within one layer, or between the sibling layers execution and
# objective -- is a *crossing*, and passes only if DECLARED_CROSSINGS names it, with its
# reason. TYPE_CHECKING-only and function-local imports obey exactly the same rules.
LAYERS: dict[str, frozenset[str]] = {
    "foundation": frozenset({"<root>", "errors", "utils", "config", "recipes"}),  # recipes: YAML
    "contracts": frozenset({"schemas", "environments"}),
    "execution": frozenset({"models", "agent"}),
    "objective": frozenset({"trajectory", "selection", "losses"}),
    "supervision": frozenset({"teachers", "cache"}),
    "orchestration": frozenset({"training"}),
    "surfaces": frozenset({"export", "inspection"}),
    "lab": frozenset({"lab"}),
    "entry": frozenset({"cli"}),
}
LAYER_ARROWS: dict[str, frozenset[str]] = {
    "foundation": frozenset(),
    "contracts": frozenset({"foundation"}),
    "execution": frozenset({"contracts"}),
    "objective": frozenset({"contracts"}),
    "supervision": frozenset({"execution", "objective"}),
    "orchestration": frozenset({"supervision"}),
    "surfaces": frozenset({"orchestration"}),
    "lab": frozenset({"surfaces"}),
    "entry": frozenset({"lab"}),
}
CORE_LAYERS = frozenset(LAYERS) - {"lab", "entry"}
"""The core: everything a training run needs. Only the CLI (``entry``) sits above the lab."""


@dataclass(frozen=True)
class Crossing:
    """One declared import between packages that the layer arrows alone do not allow.

    ``modules`` (importer modules) and ``function`` (an enclosing function) narrow it;
    ``None`` means any module of the package / any scope.
    """

    importer: str
    imported: str
    why: str
    modules: tuple[str, ...] | None = None
    function: str | None = None


DECLARED_CROSSINGS: tuple[Crossing, ...] = (
    Crossing("utils", "errors", "helpers raise the typed errors"),
    Crossing("config", "errors", "validation problems become a ConfigError"),
    Crossing("config", "utils", "loading reads YAML through utils"),
    Crossing(
        "environments", "schemas", "verifiers return VerificationRecord; prompts use schemas.text"
    ),
    Crossing(
        "agent",
        "models",
        "the rollout loop drives a backend; models never imports agent (the text contract "
        "both need is schemas/text.py)",
    ),
    Crossing(
        "agent",
        "trajectory",
        "the j -> j-1 mask convention and segment keys live once, in trajectory/",
        modules=("miniverl.agent.transcript", "miniverl.agent.loop", "miniverl.agent.corrective"),
    ),
    Crossing("selection", "trajectory", "selectors pick among model target positions (masks)"),
    Crossing(
        "export",
        "inspection",
        "result.json reads the run directory through the one reader",
        modules=("miniverl.export.result",),
    ),
)

SURFACES = LAYERS["surfaces"]
TORCH_FREE_MODULES_PREFIXES = (
    "miniverl.lab.config",
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
    "miniverl.export.result",
    "miniverl.export.verl_tool",
    "miniverl.lab.verl",
    "miniverl.models.base",
    "miniverl.models.tokenizers",
)


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


def _is_module(name: str) -> bool:
    """Whether dotted ``name`` is a module file of ``src`` (``a/b.py`` or ``a/b/__init__.py``)."""
    path = SRC_DIR.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
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
        # "from miniverl import training" / "from miniverl.config import models" import a
        # submodule; any other name comes from the package's own __init__.py.
        submodules = [a.name for a in node.names if _is_module(f"{target}.{a.name}")]
        for name in submodules:
            self._add(f"{target}.{name}", node.lineno)
        if len(submodules) < len(node.names):
            self._add(target, node.lineno)


def _edges_of_source(module: str, source: str, *, is_package: bool = False) -> list[ImportEdge]:
    collector = _Collector(module, is_package)
    collector.visit(ast.parse(source, filename=module))
    return collector.edges


def _edges(path: Path) -> list[ImportEdge]:
    source = path.read_text(encoding="utf-8")
    return _edges_of_source(_module_name(path), source, is_package=path.name == "__init__.py")


def _layer(module: str) -> str | None:
    """First component below ``miniverl`` ("<root>" for the package itself); None if external."""
    if module == "miniverl":
        return "<root>"
    if not module.startswith("miniverl."):
        return None
    return module.split(".")[1]


MODULE_FILES = sorted(PACKAGE_ROOT.rglob("*.py"))
ALL_EDGES = [edge for path in MODULE_FILES for edge in _edges(path)]
LAYER_OF = {package: layer for layer, packages in LAYERS.items() for package in packages}


@functools.cache
def _reachable(layer: str) -> frozenset[str]:
    """The layers ``layer`` may import: those its arrows reach, transitively (not itself)."""
    out: set[str] = set()
    for lower in LAYER_ARROWS[layer]:
        out |= {lower, *_reachable(lower)}
    return frozenset(out)


def _declared(edge: ImportEdge) -> Crossing | None:
    src, dst = _layer(edge.importer), _layer(edge.imported)
    for crossing in DECLARED_CROSSINGS:
        if (
            (crossing.importer, crossing.imported) == (src, dst)
            and (crossing.modules is None or edge.importer in crossing.modules)
            and (crossing.function is None or crossing.function in edge.functions)
        ):
            return crossing
    return None


def _layer_violations(edges: list[ImportEdge]) -> list[str]:
    """One line per import the layer table forbids. No scope is exempt: module level,
    function-local and ``if TYPE_CHECKING:`` imports are judged alike."""
    bad = []
    for edge in edges:
        src, dst = _layer(edge.importer), _layer(edge.imported)
        if dst is None or src == dst:
            continue
        if src not in LAYER_OF or dst not in LAYER_OF:
            bad.append(f"{edge.where}: package {src or dst!r} is missing from LAYERS")
            continue
        if LAYER_OF[dst] in _reachable(LAYER_OF[src]) or _declared(edge) is not None:
            continue
        kind = "a TYPE_CHECKING-only import" if edge.type_checking else "an import"
        bad.append(
            f"{edge.where}: {kind} from {src} ({LAYER_OF[src]}) to {dst} ({LAYER_OF[dst]}) "
            "that the layer table does not allow; move the shared name down a layer, or "
            "declare the crossing in DECLARED_CROSSINGS with its reason"
        )
    return bad


def test_the_parser_sees_the_tree() -> None:
    modules = {_module_name(p) for p in MODULE_FILES}
    assert {
        "miniverl.errors",
        "miniverl.schemas.trajectory",
        "miniverl.schemas.text",
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
        if e.importer == "miniverl.cli.main" and e.imported == "miniverl.lab.config"
    ]
    assert cli_local and all(e.functions for e in cli_local)
    assert any(e.functions == ("validate",) for e in cli_local)


def test_the_layer_table_covers_every_package_once() -> None:
    packages = {_layer(_module_name(p)) for p in MODULE_FILES}
    listed = [package for members in LAYERS.values() for package in members]
    assert sorted(listed) == sorted(set(listed)), "a package sits in two layers"
    assert packages <= set(listed), f"not in LAYERS: {sorted(packages - set(listed))}"
    assert set(LAYER_ARROWS) == set(LAYERS)
    for layer in LAYERS:
        assert layer not in _reachable(layer), f"the layer arrows loop through {layer}"


def test_every_import_follows_the_layer_table() -> None:
    bad = _layer_violations(ALL_EDGES)
    assert not bad, "\n".join(bad)


def test_every_declared_crossing_is_a_real_crossing_and_is_used() -> None:
    """No stale or redundant rule: each names an import that exists and needs it."""
    for crossing in DECLARED_CROSSINGS:
        src, dst = LAYER_OF[crossing.importer], LAYER_OF[crossing.imported]
        assert crossing.importer != crossing.imported and dst not in _reachable(src), (
            f"{crossing} is already allowed by the layer arrows"
        )
        assert crossing.why.strip(), f"{crossing} gives no reason"
        used = [e for e in ALL_EDGES if _declared(e) is crossing]
        assert used, f"{crossing} matches no import in src/: delete it"


def test_the_agent_trajectory_crossing_is_declared_not_implicit() -> None:
    """agent (execution) and trajectory (objective) are sibling layers, so the import passes
    only through its entry in DECLARED_CROSSINGS, and only from the modules named there."""
    crossing = [
        c for c in DECLARED_CROSSINGS if (c.importer, c.imported) == ("agent", "trajectory")
    ]
    assert len(crossing) == 1 and crossing[0].modules
    assert "trajectory" not in {p for layer in _reachable(LAYER_OF["agent"]) for p in LAYERS[layer]}
    edges = [
        e for e in ALL_EDGES if (_layer(e.importer), _layer(e.imported)) == ("agent", "trajectory")
    ]
    assert edges and all(_declared(e) is crossing[0] for e in edges)
    stray = _edges_of_source("miniverl.agent.protocol", "from miniverl.trajectory.masks import x\n")
    assert len(_layer_violations(stray)) == 1  # the same import from another agent module fails


def test_no_package_import_cycle() -> None:
    """Declared same-layer crossings may point one way only (e.g. agent -> models)."""
    graph: dict[str, set[str]] = {}
    for e in ALL_EDGES:
        src, dst = _layer(e.importer), _layer(e.imported)
        if dst is not None and src != dst:
            graph.setdefault(src, set()).add(dst)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
            for nxt in graph.get(start, ())
        )

    cyclic = sorted(p for p in graph if reaches(p, p, {p}))
    assert not cyclic, f"packages on an import cycle: {cyclic}"


# -- no import cycles between files -------------------------------------------------------


def _file_graph(edges: list[ImportEdge]) -> dict[str, set[str]]:
    """Module -> the modules of ``src`` it imports; every file (``__init__.py`` too) is a node.

    External imports and a module importing itself are left out. Module level,
    function-local and ``TYPE_CHECKING`` imports are edges alike: each one means the importer
    cannot be understood without the imported file.
    """
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set())
        if edge.imported != edge.importer and _is_module(edge.imported):
            graph[edge.importer].add(edge.imported)
            graph.setdefault(edge.imported, set())
    return graph


def _descendants(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every node reachable from ``start`` by one or more edges."""
    seen: set[str] = set()
    stack = list(graph.get(start, ()))
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(graph.get(node, ()))
    return seen


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of two or more nodes, each sorted, in sorted order.

    Two nodes share a component when each reaches the other, so a cycle through any number
    of files is one component, and two cycles that share a file merge into one.
    """
    reach = {node: _descendants(graph, node) for node in graph}
    cycles: list[list[str]] = []
    placed: set[str] = set()
    for node in sorted(graph):
        if node in placed:
            continue
        component = sorted({node} | {other for other in reach[node] if node in reach[other]})
        placed.update(component)
        if len(component) >= 2:
            cycles.append(component)
    return cycles


def _cycle_report(cycles: list[list[str]], edges: list[ImportEdge]) -> str:
    """Each cycle with the import lines that close it, so the fix can start at one of them."""
    lines = []
    for component in cycles:
        members = set(component)
        lines.append(f"import cycle between {len(component)} files: {', '.join(component)}")
        lines += [
            f"  {e.where}{' (TYPE_CHECKING)' if e.type_checking else ''}"
            for e in edges
            if e.importer in members and e.imported in members and e.importer != e.imported
        ]
    lines.append(
        "break each by direction: move what the lower file needs from the higher one down "
        "into it (or a file below both), or pass it in"
    )
    return "\n".join(lines)


def test_no_import_cycles_between_files() -> None:
    cycles = import_cycles(_file_graph(ALL_EDGES))
    assert not cycles, _cycle_report(cycles, ALL_EDGES)


def test_the_cycle_finder_finds_a_three_cycle_and_passes_a_dag() -> None:
    dag = {"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a"}}
    assert import_cycles(dag) == []
    three = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(three) == [["a", "b", "c"]]
    two_joined = {"a": {"b"}, "b": {"a", "c"}, "c": {"b"}, "x": {"y"}, "y": {"x"}, "z": {"z"}}
    assert import_cycles(two_joined) == [["a", "b", "c"], ["x", "y"]]


def test_the_file_graph_sees_deferred_and_submodule_imports() -> None:
    """A TYPE_CHECKING import one way and a function-local ``from package import module`` the
    other way are still a cycle; a package's ``__init__.py`` is a file like any other."""
    sources = {
        "miniverl.agent.episode": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from miniverl.agent.loop import RolloutRunner\n"
        ),
        "miniverl.agent.loop": "def f():\n    from miniverl.agent import episode\n",
        "miniverl.cache": "from miniverl.cache.store import TeacherCache\n",
        "miniverl.cache.store": "from miniverl.cache import TeacherCache\n",
        "miniverl.schemas.text": "import miniverl.errors\n",
    }
    edges = [
        edge
        for module, source in sources.items()
        for edge in _edges_of_source(module, source, is_package=module == "miniverl.cache")
    ]
    cycles = import_cycles(_file_graph(edges))
    assert cycles == [
        ["miniverl.agent.episode", "miniverl.agent.loop"],
        ["miniverl.cache", "miniverl.cache.store"],
    ]
    report = _cycle_report(cycles, edges)
    assert "miniverl.agent.loop:2 in f() imports miniverl.agent.episode" in report
    assert "miniverl.agent.episode:3 imports miniverl.agent.loop (TYPE_CHECKING)" in report


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        (
            "miniverl.agent.loop",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from miniverl.training.recipe import OPDTrainer\n",
            "miniverl.agent.loop:3 imports miniverl.training.recipe: a TYPE_CHECKING-only "
            "import from agent (execution) to training (orchestration)",
        ),
        (
            "miniverl.models.base",
            "import typing\nif typing.TYPE_CHECKING:\n    from miniverl.agent.transcript import T\n",
            "a TYPE_CHECKING-only import from models (execution) to agent (execution)",
        ),
        (
            "miniverl.schemas.trajectory",
            "def f():\n    from miniverl.models.base import CausalLMBackend\n",
            "miniverl.schemas.trajectory:2 in f() imports miniverl.models.base: an import from "
            "schemas (contracts) to models (execution)",
        ),
        (
            "miniverl.models.toy",
            "from miniverl.losses.exact import kl\n",  # allowed only inside the fit step
            "an import from models (execution) to losses (objective)",
        ),
        (
            "miniverl.trajectory.masks",
            "from miniverl.selection import selectors\n",  # same layer, undeclared
            "an import from trajectory (objective) to selection (objective)",
        ),
    ],
)
def test_the_rules_reject_what_they_should(module: str, source: str, expected: str) -> None:
    [message] = _layer_violations(_edges_of_source(module, source))
    assert expected in message and "DECLARED_CROSSINGS" in message


def test_the_rules_accept_declared_and_downward_imports() -> None:
    ok = [
        ("miniverl.lab.teachers.fitting", "from miniverl.losses import x\n"),
        ("miniverl.cli.main", "def f():\n    from miniverl.lab.config import LabConfig\n"),
        ("miniverl.agent.loop", "from miniverl.models.base import CausalLMBackend\n"),
        ("miniverl.training.recipe", "from miniverl.cache.store import TeacherCache\n"),
        ("miniverl.schemas.text", "from miniverl.errors import ConfigError\n"),
    ]
    for module, source in ok:
        assert _layer_violations(_edges_of_source(module, source)) == [], module


def test_cli_imports_heavy_layers_only_inside_commands() -> None:
    heavy = {"models", "losses", "teachers", "training", "agent", "lab"}
    bad = [
        e.where
        for e in ALL_EDGES
        if _layer(e.importer) == "cli" and not e.functions and _layer(e.imported) in heavy
    ]
    assert bad == []


def test_inspection_stays_torch_free() -> None:
    forbidden = {"models", "losses", "teachers", "training", "lab"}
    bad = [
        e.where
        for e in ALL_EDGES
        if _layer(e.importer) == "inspection" and _layer(e.imported) in forbidden
    ]
    assert bad == []


# -- one text contract: each chat marker and tool tag is spelled out in one module ------------

TEXT_CONTRACT_MODULE = "miniverl.schemas.text"
VOCABULARY = (
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_result>",
    "</tool_result>",
    "<final>",
    "</final>",
)


def _code_strings(source: str) -> list[tuple[int, str]]:
    """Every string constant in ``source`` (f-string pieces included) except docstrings:
    prose may name a tag, code must take it from miniverl.schemas.text."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def _vocabulary_copies(sources: dict[str, str]) -> dict[str, list[str]]:
    """tag -> ["module:line", ...] for every code string that contains it."""
    hits: dict[str, list[str]] = {tag: [] for tag in VOCABULARY}
    for module, source in sources.items():
        for lineno, text in _code_strings(source):
            for tag in VOCABULARY:
                if tag in text:
                    hits[tag].append(f"{module}:{lineno}")
    return hits


SOURCES = {_module_name(p): p.read_text(encoding="utf-8") for p in MODULE_FILES}


def test_the_vocabulary_is_the_text_contracts() -> None:
    from miniverl.schemas.text import PROTOCOL_TOKENS

    assert PROTOCOL_TOKENS == VOCABULARY


def test_each_tag_is_spelled_out_in_exactly_one_module() -> None:
    copies = _vocabulary_copies(SOURCES)
    elsewhere = {
        tag: [hit for hit in hits if not hit.startswith(TEXT_CONTRACT_MODULE + ":")]
        for tag, hits in copies.items()
    }
    copied = {tag: hits for tag, hits in elsewhere.items() if hits}
    assert not copied, f"import these from {TEXT_CONTRACT_MODULE} instead of copying them: {copied}"
    assert all(copies[tag] for tag in VOCABULARY)  # and they are defined there


def test_the_vocabulary_scan_sees_copies_but_not_prose() -> None:
    source = '''"""Module docs may say <final> and <tool_call>."""
def f():
    """So may a function's: ``</tool_result>``."""
    return f"{x}</final>" + "<|im_end|>\\n"
'''
    copies = _vocabulary_copies({"m": source})
    assert copies["</final>"] == ["m:4"] and copies["<|im_end|>"] == ["m:4"]
    assert copies["<final>"] == copies["<tool_call>"] == copies["</tool_result>"] == []


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


# -- the core never imports the lab ------------------------------------------------------------


def test_the_core_never_imports_the_lab() -> None:
    """``miniverl.lab`` imports the core; no core module imports the lab, at any scope (only
    the CLI, above both, does)."""
    bad = [
        e.where
        for e in ALL_EDGES
        if _layer(e.imported) == "lab" and LAYER_OF.get(_layer(e.importer) or "") in CORE_LAYERS
    ]
    assert bad == []


def test_the_lab_rule_sees_a_core_import_of_the_lab() -> None:
    for module in (
        "miniverl.training.recipe",
        "miniverl.inspection.run_dir",
        "miniverl.config.models",
    ):
        source = "def f():\n    from miniverl.lab.config import LabConfig\n"
        [message] = _layer_violations(_edges_of_source(module, source))
        assert "to lab (lab)" in message


MAX_CORE_LINES = 25_000
"""The core stays readable in a few sittings: ``src/miniverl`` without ``lab/``, in lines."""


def _core_files(root: Path) -> list[Path]:
    return [p for p in sorted(root.rglob("*.py")) if "lab" not in p.relative_to(root).parts[:1]]


def test_the_core_without_the_lab_is_at_most_25k_lines() -> None:
    """``find src/miniverl -path src/miniverl/lab -prune -o -name '*.py' -print | xargs cat | wc -l``."""
    lines = sum(len(p.read_bytes().splitlines()) for p in _core_files(PACKAGE_ROOT))
    assert lines <= MAX_CORE_LINES, f"the core has {lines} lines; move study tooling to lab/"


def test_the_core_line_count_leaves_the_lab_out(tmp_path: Path) -> None:
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "x.py").write_text("a = 1\n")
    (tmp_path / "core.py").write_text("b = 2\n")
    (tmp_path / "slab.py").write_text("c = 3\n")
    assert [p.name for p in _core_files(tmp_path)] == ["core.py", "slab.py"]
