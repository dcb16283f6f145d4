"""The ``miniverl`` command line.

``doctor``, ``validate``, ``inspect``, ``report``, ``export`` and ``cache`` are torch-free: they
import only the foundation, contracts and surfaces (and the lab's torch-free recipe layer),
and a test runs them in a subprocess asserting that ``torch`` never enters ``sys.modules``.
Commands that train import the training layer inside their function bodies. The lab's
commands (``benchmark``, ``lr-grid``, ``teacher-audit``: ``cli/lab_cmd.py``) are one panel of
the same CLI; ``train`` and ``demo`` ask the lab for the teacher a recipe's lab section
describes (``miniverl.lab.teachers.prepare``) and hand it to the core's trainer.

Every :class:`~miniverl.errors.MiniverlError` is printed as message + hint on stderr
with exit status 1; there is no traceback for user errors.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from miniverl import __version__
from miniverl.cli.cache_cmd import cache_app
from miniverl.cli.common import (
    Overrides,
    Quiet,
    Verbose,
    console,
    fail,
    handles_errors,
)
from miniverl.cli.export_model_cmd import export_model_command
from miniverl.cli.export_verl_cmd import export_verl
from miniverl.cli.lab_cmd import benchmark_command, lr_grid_command, teacher_audit_command
from miniverl.cli.models_cmd import models_app
from miniverl.config.modes import MODES
from miniverl.errors import ConfigError
from miniverl.utils.lazy import INSTALL_HINT, import_torch, is_available
from miniverl.utils.runlock import run_lock
from miniverl.utils.safe_load import MAX_YAML_BYTES, read_regular_bytes

APP_HELP = (
    "On-policy distillation of tool-using LM agents. Everything a newcomer runs works on the "
    "CPU: 'miniverl demo' trains a toy student end to end with no network and no GPU. "
    "Hugging Face models train on the CPU or on a CUDA GPU (models.device)."
)

RUN, INSPECT, LAB, EXPORT, MAINTAIN = "Run", "Inspect", "Lab", "Export", "Maintain"
WORKFLOW: dict[str, tuple[str, ...]] = {
    RUN: ("doctor", "demo", "validate", "train", "eval"),
    INSPECT: ("inspect", "report"),
    LAB: ("benchmark", "lr-grid", "teacher-audit"),
    EXPORT: ("export", "export-model", "export-verl"),
    MAINTAIN: ("cache", "models"),
}
"""``--help`` lists commands in this order, one panel per stage of a user's workflow."""


class WorkflowGroup(TyperGroup):
    """The root group: commands listed in :data:`WORKFLOW` order, not registration order."""

    def list_commands(self, ctx: Any) -> list[str]:
        order = [name for names in WORKFLOW.values() for name in names]
        known = [n for n in order if n in self.commands]
        return known + [n for n in self.commands if n not in order]


app = typer.Typer(
    name="miniverl",
    cls=WorkflowGroup,
    help=APP_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(
    "export-verl",
    rich_help_panel=EXPORT,
    short_help="A verl experiment from an OPD recipe: parquet data, tools, launch script "
    "(writes on the CPU; verl itself trains on GPUs).",
)(export_verl)
app.command(
    "export-model",
    rich_help_panel=EXPORT,
    short_help="The trained student as a peft adapter, a merged transformers model or toy "
    "safetensors (CPU).",
)(export_model_command)
app.command(
    "benchmark",
    rich_help_panel=LAB,
    short_help="Compare objectives from one shared SFT cold start per seed (on the recipe's "
    "models.device: CPU or GPU).",
)(benchmark_command)
app.command(
    "lr-grid",
    rich_help_panel=LAB,
    short_help="Select each arm's learning rate on the validation split from one shared grid "
    "(runs on the recipe's models.device: CPU or GPU).",
)(lr_grid_command)
app.command(
    "teacher-audit",
    rich_help_panel=LAB,
    short_help="What the run's teacher targets at the student's own states: per position "
    "class, top targets, EOS and closing tags (CPU).",
)(teacher_audit_command)
app.add_typer(
    cache_app,
    name="cache",
    rich_help_panel=MAINTAIN,
    help="Inspect, validate and prune a teacher cache (CPU, torch-free).",
)
app.add_typer(
    models_app,
    name="models",
    rich_help_panel=MAINTAIN,
    help="Fetch and convert pretrained models without a model hub (CPU).",
)

NoReport = Annotated[bool, typer.Option("--no-report", help="Skip report.html and summary.md.")]


def _print_version(value: bool) -> None:
    if value:
        console.print(f"miniverl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Root options only; the help text is :data:`APP_HELP`."""


# -- doctor -------------------------------------------------------------------------

_TORCH_PROBE = (
    "import json, torch; print(json.dumps({'torch': torch.__version__, "
    "'cuda_available': torch.cuda.is_available(), 'cuda': torch.version.cuda, "
    "'devices': [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}))"
)


def probe_torch(timeout_s: float = 60.0) -> dict[str, Any]:
    """Ask a *separate* Python process about torch and CUDA, so this one stays torch-free."""
    if not is_available("torch"):
        return {
            "status": "absent",
            "hint": INSTALL_HINT,
        }
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _TORCH_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"status": "error", "detail": f"torch probe timed out after {timeout_s:.0f}s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
        return {"status": "error", "detail": last}
    return {"status": "ok", **json.loads(proc.stdout.strip().splitlines()[-1])}


@app.command(
    rich_help_panel=RUN,
    short_help="Check this machine: Python, packages, torch and CUDA, free disk (CPU, torch-free).",
)
@handles_errors
def doctor(
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    no_torch_probe: Annotated[
        bool, typer.Option("--no-torch-probe", help="Skip the torch/CUDA subprocess probe.")
    ] = False,
) -> None:
    """Describe this machine: Python, packages, torch/CUDA, free disk, environments."""
    from miniverl.environments.registry import available_environments
    from miniverl.utils.env import package_versions

    usage = shutil.disk_usage(Path.cwd())
    report = {
        "miniverl": __version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "packages": package_versions(),
        "torch": {"status": "skipped"} if no_torch_probe else probe_torch(),
        "free_disk_gib": round(usage.free / (1 << 30), 1),
        "environments": available_environments(),
    }
    if json_out:
        console.print_json(json.dumps(report))
        return
    table = Table(title=f"miniverl {__version__} doctor", show_header=True)
    table.add_column("check")
    table.add_column("value")
    table.add_row("python", report["python"])
    table.add_row("platform", report["platform"])
    torch_info = report["torch"]
    if torch_info["status"] == "ok":
        cuda = (
            f"CUDA {torch_info['cuda']} ({', '.join(torch_info['devices'])})"
            if torch_info["cuda_available"]
            else "no CUDA device (CPU only)"
        )
        table.add_row("torch", f"{torch_info['torch']}: {cuda}")
    else:
        table.add_row(
            "torch",
            Text(
                f"{torch_info['status']}: {torch_info.get('hint') or torch_info.get('detail') or ''}"
            ),
        )
    for name, ver in report["packages"].items():
        table.add_row(f"  {name}", ver or "[dim]not installed[/]")
    table.add_row("free disk", f"{report['free_disk_gib']} GiB")
    table.add_row("environments", ", ".join(report["environments"]))
    console.print(table)
    console.print(
        "torch-free commands: doctor, validate, inspect, report, export, cache.", markup=False
    )
    if not is_available("torch"):
        console.print(f"Training needs torch: {INSTALL_HINT}", markup=False, soft_wrap=True)


# -- validate -----------------------------------------------------------------------


@app.command(
    rich_help_panel=RUN,
    short_help="Check a recipe; show the settings it changes from the defaults (CPU, torch-free).",
)
@handles_errors
def validate(
    recipe: Annotated[Path, typer.Argument(help="YAML recipe to validate.")],
    overrides: Overrides = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Only the verdict and digest.")
    ] = False,
    full: Annotated[
        bool,
        typer.Option("--full", help="Print the whole resolved config, not only what differs."),
    ] = False,
) -> None:
    """Validate a recipe, its core sections and its lab section together: the verdict first,
    then the settings that differ from the defaults (--full: all of them), or every error with
    its key path."""
    from miniverl.lab.config import load_recipe

    config = load_recipe(recipe, overrides or [])
    from miniverl.environments.tasks_file import check_environment

    env_note = check_environment(config.environment, config.rollout.max_turns)
    console.print(
        f"[green]valid[/] {recipe} (digest {config.digest()[:16]}, mode {config.run.mode}, objective {config.objective_label()})",
        soft_wrap=True,
    )
    if quiet:
        return
    console.print(f"# {env_note}", markup=False, soft_wrap=True)
    if full:
        console.print("# the whole resolved config:", markup=False)
        console.print(config.to_yaml(), markup=False, end="")
        return
    changed = changed_settings(config)
    console.print(
        f"# {len(changed)} setting(s) differ from the defaults (--full for the whole resolved config):",
        markup=False,
    )
    if changed:
        import yaml

        console.print(
            yaml.safe_dump(nest(changed), sort_keys=False, default_flow_style=False).rstrip(),
            markup=False,
        )


def changed_settings(config: Any) -> dict[str, Any]:
    """``{"train.cycles": 4, ...}``: every leaf of ``config`` whose value differs from the
    default recipe's (an empty recipe of the same class), in the config's own section order."""
    defaults = dict(_leaves(type(config).from_mapping({}, source="<defaults>").to_dict()))
    missing = object()
    return {k: v for k, v in _leaves(config.to_dict()) if defaults.get(k, missing) != v}


def _leaves(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted leaves of a nested mapping; an empty mapping is itself a leaf."""
    if not isinstance(data, dict) or not data:
        return [(prefix, data)]
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        out.extend(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`_leaves` for printing: ``{"a.b": 1}`` -> ``{"a": {"b": 1}}``."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


# -- inspect ------------------------------------------------------------------------


@app.command(
    rich_help_panel=INSPECT,
    short_help="Count how every episode of a trajectories.jsonl ended; token provenance (CPU, torch-free).",
)
@handles_errors
def inspect(
    path: Annotated[Path, typer.Argument(help="A trajectories.jsonl file.")],
    limit: Annotated[int, typer.Option("--limit", min=0, help="Per-trajectory rows to show.")] = 5,
    trajectory: Annotated[
        str | None, typer.Option("--trajectory", help="Restrict to one trajectory id.")
    ] = None,
    spans: Annotated[
        bool, typer.Option("--spans", help="With --trajectory: print the span table.")
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Machine-readable FileSummary.to_dict().")
    ] = False,
    all_versions: Annotated[
        bool, typer.Option("--all-versions", help="List every policy version, not a summary.")
    ] = False,
    wide: Annotated[
        bool,
        typer.Option("--wide", help="Print tables at their full width, never folding a column."),
    ] = False,
) -> None:
    """Validate a trajectory file; count how every episode ended, student rollouts, teacher
    samples, oracle traces and evaluation episodes apart; show token provenance."""
    from miniverl.inspection.summary import plural, summarize_file
    from miniverl.utils.versions import summarize_versions

    if spans and trajectory is None:
        raise fail("--spans needs --trajectory ID", code=2)
    summary = summarize_file(path, trajectory_id=trajectory, limit=limit, spans=spans)
    if trajectory is not None and summary.trajectories == 0:
        raise fail(
            f"trajectory {trajectory!r} not found in {path}", "run without --trajectory to list ids"
        )
    if json_out:
        sys.stdout.write(json.dumps(summary.to_dict(), indent=2, sort_keys=True) + "\n")
        return
    for line in outcome_lines(summary):
        console.print(line, markup=False, soft_wrap=True)
    console.print(
        f"  {plural(summary.trajectories, 'trajectory', 'trajectories')} | "
        f"{plural(summary.tokens, 'token')} | {plural(summary.model_tokens, 'model token')} "
        f"({100 * summary.model_token_fraction:.1f}%) | {summary.critical_tokens} critical",
        markup=False,
    )
    versions = (
        ", ".join(map(str, summary.policy_versions))
        if all_versions
        else summarize_versions(summary.policy_versions)
    )
    console.print(f"  policy versions {versions}", markup=False)
    console.print(f"  termination {summary.termination}", markup=False)
    console.print(f"  tools {summary.tools}", markup=False)
    console.print(
        f"  tokenizer {[f[:12] + '...' for f in summary.tokenizer_fingerprints]}", markup=False
    )

    from miniverl.schemas.trajectory import MODEL_GENERATED_SPAN_TYPES, SpanType

    table = Table(title="tokens by span type (only assistant_* can enter the loss)")
    table.add_column("span type", overflow="fold")
    table.add_column("tokens", justify="right")
    table.add_column("in loss", overflow="fold")
    for span_type, count in summary.tokens_by_span_type.items():
        in_loss = SpanType(span_type) in MODEL_GENERATED_SPAN_TYPES
        table.add_row(span_type, str(count), "yes" if in_loss else "no (context)")
    console.print(table)

    if summary.rows and limit:
        _print_rows(summary.rows, wide=wide)

    if summary.spans is not None:
        _print_spans(summary.spans, trajectory or "")


SPAN_TEXT_INDENT = 6
"""Columns before a span's text in ``inspect --spans``: it sits under its span's header line."""


def _print_spans(spans: list[Any], trajectory: str) -> None:
    """One header line per span, then its text wrapped to the console between tokens.

    A table column folds its text at the column edge, mid-word (``argumen|ts``); these lines
    are broken only where :func:`~miniverl.inspection.summary.wrap_span_text` allows and are
    printed unwrapped, so what the terminal shows is the text as written.
    """
    from miniverl.inspection.summary import plural, wrap_span_text

    console.print(Text(f"spans of {trajectory} (\\n marks a newline in the text)"), soft_wrap=True)
    width = max(console.width - SPAN_TEXT_INDENT, 10)
    for s in spans:
        loss = "in the loss" if s.in_loss else "not in the loss (context)"
        header = f"  {s.span_type} [{s.start}, {s.end}) {plural(s.tokens, 'token')}, {loss}"
        console.print(Text(header), soft_wrap=True)
        for line in wrap_span_text(s.text, width):
            console.print(Text(" " * SPAN_TEXT_INDENT + line), soft_wrap=True)


def outcome_lines(summary: Any) -> list[str]:
    """The header of ``inspect``: every trajectory counted once, by origin and by how it ended.

    Oracle traces are solved by construction, so a file that mixes them with student
    rollouts gets one outcome line per origin (:data:`~miniverl.inspection.summary.ORIGIN_NAMES`)
    instead of one rate over both. The solve rate over graded trajectories alone reads 100%
    when half the episodes never answered, so each outcome line divides by all trajectories of
    its origin and names the unanswered ones; the graded rate follows on its own line.
    """
    from miniverl.inspection.summary import count_origin, plural

    origins = summary.origins
    if not origins:
        return [f"  {plural(summary.trajectories, 'trajectory', 'trajectories')}"]
    lines = []
    if len(origins) > 1:
        parts = ", ".join(count_origin(o.trajectories, name) for name, o in origins.items())
        lines.append(
            f"  {plural(summary.trajectories, 'trajectory', 'trajectories')}, "
            f"counted by origin below: {parts}"
        )
    for name, origin in origins.items():
        out = origin.outcome()
        reasons = ", ".join(f"{k} {v}" for k, v in out["without_answer_by_reason"].items())
        lines.append(
            f"  {count_origin(origin.trajectories, name)}: solved {out['solved']} "
            f"({100 * out['success_rate']:.1f}%) | answered wrong {out['answered_wrong']} | "
            f"ended without an answer {out['without_answer']}"
            + (f" ({reasons})" if reasons else "")
        )
        lines.append(
            f"    graded {origin.graded} (gave a final answer) | solved {origin.solved} "
            f"({100 * out['solve_rate_of_graded']:.1f}% of graded)"
            if origin.graded
            else "    graded 0 (none gave a final answer)"
        )
    return lines


def _print_rows(rows: list[Any], *, wide: bool) -> None:
    """The per-trajectory table, ids always whole (they are what ``--trajectory`` takes).

    When the table is wider than the terminal it becomes one plain line per trajectory
    (the terminal may wrap it, nothing is cut); ``--wide`` keeps the table at full width.
    """
    from rich.measure import Measurement

    from miniverl.inspection.summary import plural

    first = f"first {plural(len(rows), 'trajectory', 'trajectories')}"
    table = Table(
        title=first,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for col in ("trajectory", "ended by", "tokens", "model", "solved", "version", "origin"):
        table.add_column(col, no_wrap=True)
    cells = [
        (
            r.trajectory_id,
            r.termination_reason,
            str(r.tokens),
            str(r.model_tokens),
            "-" if r.solved is None else ("yes" if r.solved else "no"),
            str(r.policy_version),
            r.origin,
        )
        for r in rows
    ]
    for row in cells:
        table.add_row(*(Text(c) for c in row))
    needed = Measurement.get(console, console.options.update_width(10**6), table).maximum
    if needed <= console.width:
        console.print(table)
        return
    if wide:  # a console as wide as the table: the terminal wraps lines, rich cuts nothing
        Console(width=needed, highlight=False, file=console.file).print(table)
        return
    console.print(
        f"{first} (id, termination, tokens, model tokens, solved, version, origin; "
        "--wide for a table):",
        markup=False,
        soft_wrap=True,
    )
    for row in cells:
        console.print("  " + "  ".join(row), markup=False, soft_wrap=True)


# -- train / demo / eval ------------------------------------------------------------


def _run_trainer(trainer: Any, *, no_report: bool, recipe: Path | None = None) -> dict[str, Any]:
    """Train, then write the report unless asked not to. Ctrl-C keeps the last checkpoint."""
    from miniverl.cli.run_support import resume_command

    try:
        summary = trainer.train()
    except KeyboardInterrupt:
        raise fail(
            f"interrupted; the last completed checkpoint under {trainer.paths.checkpoints} is resumable",
            f"resume with: {resume_command(trainer.paths.root, recipe)}",
            code=130,
        ) from None
    if not no_report:
        _write_report(trainer.paths.root)
    return summary


def _write_report(run_dir: Path) -> None:
    from miniverl.lab.report.report import write_report

    html, md = write_report(run_dir)
    console.print(f"report: {html}  summary: {md}")


def _count(result: dict[str, Any] | None) -> str:
    return f"{result['solved']}/{result['tasks']}" if result else "-"


def _print_outcome(summary: dict[str, Any], run_dir: Path) -> None:
    """A finished run's held-out success per evaluation stage (what ``train`` prints last)."""
    table = Table(title=f"held-out success ({run_dir})")
    table.add_column("stage")
    table.add_column("solved", justify="right")
    table.add_column("success", justify="right")
    for stage in ("baseline", "after_warmup", "final"):
        result = summary.get(stage)
        if result:
            table.add_row(stage, _count(result), f"{100 * result['success_rate']:.1f}%")
    console.print(table)


MODE_LIST = ", ".join(list(MODES)[:-1]) + f" or {list(MODES)[-1]}"
"""Every ``run.mode``, as the help of ``train`` lists them (``config/modes.py``)."""


@app.command(
    rich_help_panel=RUN,
    help=f"Train from a recipe in the objective its run.mode names ({MODE_LIST}).",
    short_help=f"Train from a recipe in any run.mode: {MODE_LIST} (on models.device: CPU for the "
    "toy backend and small models, a CUDA GPU for larger ones).",
)
@handles_errors
def train(
    recipe: Annotated[Path, typer.Argument(help="YAML recipe.")],
    overrides: Overrides = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Run directory (default runs/<run.name>).")
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Continue the run in --output from its last complete checkpoint."
        ),
    ] = False,
    resume_from: Annotated[
        str | None,
        typer.Option(
            "--resume-from",
            metavar="NAME",
            help="Continue from checkpoints/NAME explicitly (e.g. an older one when the latest is damaged); newer ones are moved aside, never deleted.",
        ),
    ] = None,
    cold_start: Annotated[
        Path | None,
        typer.Option(
            "--cold-start",
            metavar="DIR",
            help="Start a new run from a saved cold start (cold_start.json + student.safetensors, e.g. a benchmark's seed-<n>/cold-start) weights-only instead of the SFT warm-up; refused unless it was made under the same backend, student model, adapter settings and environment.",
        ),
    ] = None,
    no_report: NoReport = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Train from a recipe (the command's help is :data:`MODE_LIST`'s sentence above)."""
    import_torch("miniverl train")
    import shlex

    from miniverl.cli.run_support import save_command, stored_overrides
    from miniverl.lab.config import load_recipe
    from miniverl.lab.run import start_run
    from miniverl.training.cold_start import check_cold_start

    given = list(overrides or [])
    resume = resume or resume_from is not None
    if resume and cold_start is not None:
        raise ConfigError(
            "--cold-start starts a new run and --resume continues one; pass one of them",
            hint="a resumed run already holds the weights it started from",
        )
    config = load_recipe(recipe, given)
    if resume and not given:
        root = output or Path("runs") / config.run.name
        stored = stored_overrides(root)
        if stored:
            given = stored
            config = load_recipe(recipe, given)
            console.print(f"resume: reusing the stored overrides {shlex.join(given)}", markup=False)
    submitted = read_regular_bytes(recipe, limit=MAX_YAML_BYTES, error=ConfigError)
    if cold_start is not None:  # before anything is fitted or written
        check_cold_start(cold_start, config)
    run_dir = output or Path("runs") / config.run.name
    with run_lock(run_dir):
        trainer = start_run(
            config,
            cold_start=cold_start,
            output_dir=run_dir,
            submitted_recipe=submitted,
            resume=resume,
            resume_from=resume_from,
            quiet=quiet,
            verbose=verbose,
        )
        if not resume:
            save_command(run_dir, command="train", recipe=str(recipe), overrides=given)
        summary = _run_trainer(trainer, no_report=no_report, recipe=recipe)
    _print_outcome(summary, trainer.paths.root)


@app.command(
    rich_help_panel=RUN,
    short_help="The positive control in miniature: from one warm-up, a toy student trained by on-policy and by offline distillation, then continued from its own tool errors (CPU, no network; --fast is a smoke test under a minute).",
)
@handles_errors
def demo(
    fast: Annotated[
        bool,
        typer.Option("--fast", help="Shrink every budget (same artifact set, under a minute)."),
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Run directory of the opd arm (default runs/demo); the offline_kd arm goes beside it, to DIR-offline_kd.",
        ),
    ] = None,
    no_report: NoReport = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Replace earlier demo runs in the output directories."),
    ] = False,
) -> None:
    """Embedded toy backend on the CPU, no network: the same toy student trained by on-policy
    distillation and by offline distillation from one SFT warm-up, side by side, and how often
    each recovers from the warm-up student's own flagged tool errors."""
    import_torch("miniverl demo")
    from miniverl.config.presets import (
        DEMO_COMPARISON_MODE,
        DEMO_MODE,
        demo_cold_start_path,
        demo_teacher_path,
    )
    from miniverl.errors import RunDirectoryError
    from miniverl.lab.demo import (
        check_shared_start,
        comparison_run_dir,
        demo_comparison,
        print_comparison,
        start_error_recovery,
        train_demo_arms,
    )
    from miniverl.utils.io import write_json
    from miniverl.utils.runs import RunPaths

    run_dir = output or Path("runs") / "demo"
    run_dirs = {DEMO_MODE: run_dir, DEMO_COMPARISON_MODE: comparison_run_dir(run_dir)}
    again = f"miniverl demo{' --fast' if fast else ''} --overwrite"
    for held in run_dirs.values():
        if not overwrite and RunPaths(held).manifest.exists():
            raise RunDirectoryError(
                f"{held} already holds a demo run",
                hint=f"pass --overwrite to replace it, or --output DIR to keep it ({again})",
            )
    try:
        outcomes = train_demo_arms(
            run_dirs, fast=fast, overwrite=overwrite, quiet=quiet, verbose=verbose, console=console
        )
    except KeyboardInterrupt:
        raise fail(
            "interrupted; the demo's runs are incomplete", f"start again with: {again}", code=130
        ) from None
    sha = check_shared_start(run_dirs)
    if not quiet:
        console.print(
            "continuing each student from the warm-up student's own errors...", markup=False
        )
    recovery = start_error_recovery(run_dirs, demo_cold_start_path(), demo_teacher_path())
    comparison = demo_comparison(
        outcomes, run_dirs, start_sha256=sha, recovery=recovery, smoke_test=fast
    )
    write_json(RunPaths(run_dir).comparison_json, comparison)
    if not no_report:  # the opd run's last: its report leads with the comparison
        for directory in reversed(run_dirs.values()):
            _write_report(directory)
    print_comparison(console, comparison)


@app.command(
    "eval",
    rich_help_panel=RUN,
    short_help="Re-evaluate a run's checkpoint on a held-out split (on the run's models.device: CPU or GPU).",
)
@handles_errors
def eval_command(
    run: Annotated[Path, typer.Option("--run", help="A finished run directory.")],
    tag: Annotated[str, typer.Option("--tag", help="Writes eval.<tag>.json.")] = "reeval",
    checkpoint: Annotated[
        str, typer.Option("--checkpoint", help="Checkpoint name under checkpoints/.")
    ] = "final",
    split: Annotated[
        str | None, typer.Option("--split", help="eval or test (default: the run's eval.split).")
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Re-evaluate a run from config.resolved.yaml and one of its checkpoints."""
    import_torch("miniverl eval")
    from miniverl.training.evaluate import evaluate_run

    result = evaluate_run(run, tag=tag, checkpoint=checkpoint, split=split, quiet=quiet)
    console.print(
        f"{tag}: {result['solved']}/{result['tasks']} solved "
        f"({100 * result['success_rate']:.1f}%) on the {result['split']} split, "
        f"checkpoint {result['checkpoint']} -> {result['path']}",
        markup=False,
        soft_wrap=True,
    )


# -- report / benchmark / export ----------------------------------------------------


@app.command(
    rich_help_panel=INSPECT,
    short_help="Write report.html and summary.md for a run or benchmark (CPU, torch-free).",
)
@handles_errors
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run or benchmark directory.")],
) -> None:
    """Write report.html (self-contained, offline) and summary.md into a run directory (torch-free)."""
    _write_report(run_dir)


@app.command(
    rich_help_panel=EXPORT,
    short_help="A shareable result.json: objective, config, evaluations, sanitized hardware (CPU, torch-free).",
)
@handles_errors
def export(
    run_dir: Annotated[Path, typer.Argument(help="A run or benchmark directory.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the shareable result.")] = Path(
        "result.json"
    ),
) -> None:
    """Write a shareable result.json: objective, config, evaluations, benchmark, sanitized hardware (torch-free)."""
    from miniverl.export.result import export_run

    export_run(run_dir, out)
    console.print(f"exported {run_dir.name} -> {out} (no hostnames, users or absolute paths)")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
