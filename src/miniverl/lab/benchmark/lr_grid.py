"""One shared learning-rate grid, selected on the validation split (docs/benchmark.md, "Learning rate").

Why: an arm whose learning rate was chosen after its test result was seen has been tuned
more than the others, and a contrast against it measures the tuning. So every arm gets
the same grid, the same seeds and arm seeds, the same cold starts and the same selection
rule, and the rule only ever sees the validation split (``eval.split=eval``):

    selected(arm) = the rate with the highest mean final validation success over all
                    (seed, arm seed) cells of that arm; an exact tie goes to the smaller rate.

The grid is an ordinary benchmark (:func:`~miniverl.lab.benchmark.harness.run_benchmark`)
whose arms are (arm, rate) pairs named ``opd@lr=0.001``: each seed has one cold start for
all of them, every held-fixed key is checked, and every finished cell is stored and reused
on a rerun. ``lr_grid.json`` records the whole table, not only the winners, so a reader sees
how flat or sharp each arm's choice was. ``miniverl benchmark --lr-from lr_grid.json`` then
runs each arm at its selected rate (:func:`arms_with_learning_rates`), after checking that
the grid was selected for the same training settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from miniverl.config.layout import canonical_layout
from miniverl.config.models import RunConfig, parse_override
from miniverl.errors import ConfigError, RunDirectoryError
from miniverl.utils.hashing import sha256_bytes, sha256_file
from miniverl.utils.io import read_json, to_json_text, write_json
from miniverl.utils.logging import utc_now

GRID_SCHEMA = "miniverl.lr_grid/1"
GRID_FILE = "lr_grid.json"
VALIDATION_SPLIT = "eval"
SELECTION_RULE = (
    "per arm, the learning rate with the highest mean final success on the validation split "
    "(eval.split=eval) over every (seed, arm seed) cell; an exact tie goes to the smaller rate"
)


def parse_grid(values: Sequence[float]) -> list[float]:
    """Distinct positive rates in increasing order; anything else is a usage error."""
    grid = sorted({float(v) for v in values})
    if not grid:
        raise ConfigError("the learning-rate grid is empty", hint="e.g. --grid 0.0003,0.001,0.003")
    bad = [v for v in grid if not v > 0]
    if bad:
        raise ConfigError(
            f"learning rates must be positive, got {bad[0]!r}",
            hint="e.g. --grid 0.0003,0.001,0.003",
        )
    names = [f"{v:g}" for v in grid]
    clash = next((n for n in names if names.count(n) > 1), None)
    if clash is not None:
        raise ConfigError(
            f"learning rates {', '.join(repr(v) for v, n in zip(grid, names, strict=True) if n == clash)} would share the arm name @lr={clash}",
            hint="use rates that differ in their first 6 significant digits",
        )
    return grid


def lr_text(lr: float) -> str:
    """A rate as an override value that YAML reads back as the same float (``1e-05`` would be a string)."""
    text = repr(float(lr))
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text


def grid_arm_name(arm: str, lr: float) -> str:
    """The benchmark arm that runs ``arm`` at ``lr``: ``opd@lr=0.001``."""
    return f"{arm}@lr={lr:g}"


def _sets_lr(overrides: Sequence[str]) -> bool:
    from miniverl.lab.benchmark.arms import override_touches

    return any(
        override_touches(".".join(parse_override(item)[0]), "train.lr") for item in overrides
    )


def grid_arm_definitions(
    arms: Mapping[str, Sequence[str]], grid: Sequence[float]
) -> dict[str, tuple[str, ...]]:
    """Every arm at every rate: the arm's own override keys plus ``train.lr``.

    An arm that sets ``train.lr`` itself is refused: the grid would not be shared with it.
    """
    for arm, overrides in arms.items():
        if _sets_lr(overrides):
            raise ConfigError(
                f"benchmark arm {arm!r} sets train.lr itself, so the shared learning-rate grid would not apply to it",
                hint="drop train.lr from the arm's overrides; the grid sets it for every arm",
            )
    return {
        grid_arm_name(arm, lr): (*overrides, f"train.lr={lr_text(lr)}")
        for arm, overrides in arms.items()
        for lr in grid
    }


def validation_overrides(overrides: Sequence[str]) -> list[str]:
    """The base overrides plus ``eval.split=eval``; an override that picks another split is refused."""
    for item in overrides:
        key, value = parse_override(item)
        if key == ["eval", "split"] and value != VALIDATION_SPLIT:
            raise ConfigError(
                f"the learning-rate grid selects on the validation split, but the overrides set eval.split={value}",
                hint="drop that override: the grid evaluates on eval.split=eval, and `miniverl benchmark --lr-from` on the split you choose",
            )
    return [*overrides, f"eval.split={VALIDATION_SPLIT}"]


def training_digest(config: Mapping[str, Any]) -> str:
    """SHA-256 of everything that shapes training: the config (``RunConfig.to_dict()``, in the
    layout ``RunConfig.digest`` hashes, ``config/layout.py``) without ``eval`` and ``train.lr``.

    The grid's choice is valid for a benchmark only when this matches: the evaluation
    split and schedule may differ (that is the point), the rate is what was chosen.
    """
    data = canonical_layout(config)
    data.pop("eval", None)
    data.get("train", {}).pop("lr", None)
    data.get("run", {}).pop("output_dir", None)
    return sha256_bytes(to_json_text(data).encode("utf-8"))


def select_learning_rates(
    rows: Sequence[Mapping[str, Any]], arms: Sequence[str], grid: Sequence[float]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]]:
    """(table, selected): per arm and rate the validation final successes, and the winner per :data:`SELECTION_RULE`."""
    table: dict[str, list[dict[str, Any]]] = {}
    selected: dict[str, float] = {}
    for arm in arms:
        entries = []
        for lr in grid:
            name = grid_arm_name(arm, lr)
            values = [float(r["final_success"]) for r in rows if r.get("arm") == name]
            if not values or any(
                r.get("final_success") is None for r in rows if r.get("arm") == name
            ):
                raise ConfigError(
                    f"the learning-rate grid has no final validation success for {name}",
                    hint="rerun `miniverl lr-grid` with the same arguments to finish its cells",
                )
            entries.append(
                {"lr": lr, "mean": sum(values) / len(values), "n": len(values), "values": values}
            )
        table[arm] = entries
        best = max(entries, key=lambda e: (e["mean"], -e["lr"]))
        selected[arm] = best["lr"]
    return table, selected


def run_lr_grid(
    recipe_path_or_config: str | Path | RunConfig,
    *,
    arms: Sequence[str] | None,
    grid: Sequence[float],
    seeds: Sequence[int],
    output_dir: str | Path,
    overrides: Sequence[str] = (),
    arm_seeds: int = 1,
    quiet: bool = True,
    run_cell: Any = None,
    resamples: int | None = None,
) -> dict[str, Any]:
    """Run every arm at every rate on the validation split; write and return ``lr_grid.json``.

    Resumable like the benchmark it is (rerun the same command). ``run_cell`` replaces
    the trainer (tests).
    """
    from miniverl.lab.benchmark.arms import resolve_arms
    from miniverl.lab.benchmark.harness import run_benchmark

    rates = parse_grid(grid)
    chosen = resolve_arms(arms)
    definitions = grid_arm_definitions(chosen, rates)
    base_overrides = validation_overrides(overrides)
    extra = {} if resamples is None else {"resamples": resamples}
    result = run_benchmark(
        recipe_path_or_config,
        arms=list(definitions),
        seeds=seeds,
        output_dir=output_dir,
        overrides=base_overrides,
        quiet=quiet,
        arm_definitions=definitions,
        arm_seeds=arm_seeds,
        run_cell=run_cell,
        **extra,
    )
    table, selected = select_learning_rates(result["rows"], list(chosen), rates)
    record = {
        "schema": GRID_SCHEMA,
        "created_at": utc_now(),
        "recipe": result["recipe"],
        "recipe_sha256": result["recipe_sha256"],
        "base_overrides": list(overrides),
        "training_digest": training_digest(result["base_config"]),
        "split": VALIDATION_SPLIT,
        "grid": rates,
        "arms": {arm: list(chosen[arm]) for arm in chosen},
        "seeds": result["seeds"],
        "arm_seeds": arm_seeds,
        "teacher_gate": result["teacher_gate"],
        "rule": SELECTION_RULE,
        "table": table,
        "selected": selected,
    }
    write_json(Path(output_dir) / GRID_FILE, record)
    return record


def read_lr_grid(path: str | Path) -> dict[str, Any]:
    """``lr_grid.json`` (a file, or the grid's directory); refused unless it is a finished grid."""
    path = Path(path)
    if path.is_dir():
        path = path / GRID_FILE
    if not path.is_file():
        raise RunDirectoryError(
            f"no learning-rate grid at {path}",
            hint="run `miniverl lr-grid RECIPE --grid ... --output DIR` first, then pass --lr-from DIR",
        )
    record = read_json(path)
    if not isinstance(record, dict) or record.get("schema") != GRID_SCHEMA:
        raise RunDirectoryError(
            f"{path} is not a learning-rate grid ({GRID_SCHEMA})",
            hint="pass the lr_grid.json that `miniverl lr-grid` wrote",
        )
    record["_sha256"] = sha256_file(path)
    return record


def arms_with_learning_rates(
    arms: Mapping[str, Sequence[str]], grid: Mapping[str, Any], base: RunConfig, source: str
) -> dict[str, tuple[str, ...]]:
    """Each arm's override keys plus the rate the grid selected for it.

    Refused when the grid was selected for other training settings (:func:`training_digest`),
    for another definition of an arm, or without an arm that is asked for.
    """
    if grid.get("training_digest") != training_digest(base.to_dict()):
        raise ConfigError(
            f"the learning-rate grid {source} was selected for other training settings than this benchmark's",
            hint="run `miniverl lr-grid` with the same recipe and non-eval overrides, or drop --lr-from",
        )
    selected = grid.get("selected") or {}
    recorded = grid.get("arms") or {}
    definitions: dict[str, tuple[str, ...]] = {}
    for arm, overrides in arms.items():
        if arm not in selected:
            raise ConfigError(
                f"benchmark arm {arm!r} has no learning rate in {source}",
                hint="run the grid with every arm you benchmark (miniverl lr-grid ... --arms ...)",
            )
        if list(recorded.get(arm) or []) != list(overrides):
            raise ConfigError(
                f"benchmark arm {arm!r} is defined differently from when {source} selected its learning rate",
                hint="rerun the learning-rate grid for the current arm definitions",
            )
        definitions[arm] = (*overrides, f"train.lr={lr_text(float(selected[arm]))}")
    return definitions


def benchmark_arms_from_grid(
    arms: Sequence[str] | None, source: str | Path, base: RunConfig
) -> tuple[dict[str, tuple[str, ...]], dict[str, Any]]:
    """(arm definitions at their selected rates, what benchmark.json records as ``learning_rates``)."""
    from miniverl.lab.benchmark.arms import resolve_arms

    grid = read_lr_grid(source)
    definitions = arms_with_learning_rates(resolve_arms(arms), grid, base, str(source))
    record = {
        "source": "lr_grid",
        "lr_grid_sha256": grid["_sha256"],
        "grid": grid.get("grid"),
        "split": grid.get("split"),
        "seeds": grid.get("seeds"),
        "arm_seeds": grid.get("arm_seeds"),
        "rule": grid.get("rule"),
        "selected": {arm: grid["selected"][arm] for arm in definitions},
    }
    return definitions, record


__all__ = [
    "GRID_FILE",
    "GRID_SCHEMA",
    "SELECTION_RULE",
    "arms_with_learning_rates",
    "benchmark_arms_from_grid",
    "grid_arm_definitions",
    "grid_arm_name",
    "lr_text",
    "parse_grid",
    "read_lr_grid",
    "run_lr_grid",
    "select_learning_rates",
    "training_digest",
    "validation_overrides",
]
