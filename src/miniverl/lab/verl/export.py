"""``miniverl export-verl``: carry a validated recipe over to verl's ``ppo_trainer``.

The export is a *translation with a ledger*. Every leaf key of the validated
:class:`~miniverl.config.models.RunConfig` gets exactly one fate, recorded in
``MAPPING.md``: ``mapped`` (it became the named verl override), ``dropped`` (it has no
verl equivalent; the value is listed so nothing disappears silently) or a refusal
(:class:`~miniverl.errors.ConfigError` listing every key whose value would change the
objective if dropped, e.g. ``loss.divergence: jsd``). A key this module has no rule for
is dropped *and* flagged, so a key added to the recipe later is never lost quietly.

Targets verl 0.9.1 (``verl/trainer/config/ppo_trainer.yaml``). Torch-free: only the
parquet writer needs ``pyarrow`` (the ``verl-export`` extra), imported when writing.

This module plans the export (:func:`plan_export`) and writes it (dataset rows, parquet,
``tools.yaml``, ``run_verl.sh``, ``MAPPING.md``); the per-key rules and the fixed overrides
are :mod:`miniverl.lab.verl.ledger`.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from miniverl import __version__
from miniverl.config.models import RunConfig
from miniverl.environments.base import Task, ToolSpec
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.errors import BackendError, ConfigError
from miniverl.lab.verl.ledger import (
    AGENT_LOOP,
    DROPPED,
    EXPORT_DIR_ENV,
    FIXED_NOTES,
    TOOL_CLASS,
    VERL_VERSION,
    KeyFate,
    _fixed_overrides,
    _rules,
    config_leaves,
)
from miniverl.schemas.text import TOOL_RESULT_OPEN
from miniverl.utils.io import publish_modes
from miniverl.utils.lazy import install_hint

PROMPT_OVERHEAD_TOKENS = 16
"""Chat-template tokens added per message (role header, markers), a generous bound."""


@dataclass
class ExportPlan:
    """Everything the export writes, decided before any file is touched."""

    overrides: dict[str, Any]
    fates: list[KeyFate]
    tool_specs: list[ToolSpec]
    environment: str
    environment_params: dict[str, Any]
    splits: dict[str, list[Task]] = field(default_factory=dict)

    def dropped(self) -> list[KeyFate]:
        return [f for f in self.fates if f.status == DROPPED]

    def override_strings(self) -> list[str]:
        return [f"{k}={hydra_value(v)}" for k, v in self.overrides.items()]


# -- small pure helpers ------------------------------------------------------------------


_BARE = re.compile(r"^[A-Za-z0-9_./~@:+-]+$")


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar (strings quoted unless plainly safe)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _BARE.match(text) and text.lower() not in {"null", "true", "false"} and "${" not in text:
        return text
    if "${" in text and "'" not in text:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def json_schema_type(description: str) -> str:
    """The JSON type a miniverl ToolSpec parameter description starts with (default string)."""
    first = description.strip().split(",")[0].split()[0].lower() if description.strip() else ""
    return (
        first
        if first in {"string", "integer", "number", "boolean", "array", "object"}
        else "string"
    )


def tool_schema(spec: ToolSpec) -> dict[str, Any]:
    """OpenAI function schema of one miniverl tool (verl's ``OpenAIFunctionToolSchema``)."""
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": {
                "type": "object",
                "properties": {
                    name: {"type": json_schema_type(desc), "description": desc}
                    for name, desc in spec.parameters.items()
                },
                "required": list(spec.parameters),
            },
        },
    }


def prompt_messages(env_system_prompt: str, task: Task) -> list[dict[str, str]]:
    """The chat messages miniverl's agent loop starts an episode with (system, user)."""
    return [
        {"role": "system", "content": env_system_prompt},
        {"role": "user", "content": task.prompt},
    ]


def prompt_length_bound(
    messages_per_task: list[list[dict[str, str]]], schemas: list[dict[str, Any]]
) -> int:
    """An upper bound on prompt tokens, from characters (a BPE token covers >= 1 character).

    Counts every message plus the JSON of the tool schemas, which chat templates that
    support tools render into the prompt. Rounded up to a multiple of 8. Used for ``data.max_prompt_length`` with
    ``truncation: error``, so an underestimate would fail loudly in verl, not truncate.
    """
    tools = len(json.dumps(schemas)) + 4 * PROMPT_OVERHEAD_TOKENS if schemas else 0
    longest = tools + max(
        sum(len(m["content"]) + PROMPT_OVERHEAD_TOKENS for m in msgs) for msgs in messages_per_task
    )
    return -(-longest // 8) * 8


def plan_export(cfg: RunConfig, *, max_prompt_tokens: int | None = None) -> ExportPlan:
    """Decide every override and every key's fate; raise ConfigError listing all refusals.

    ``max_prompt_tokens`` replaces the character bound of the prompt (e.g. a count measured
    with the student's chat template); verl's ``truncation: error`` fails loudly if it is low.
    """
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ConfigError(f"--max-prompt-tokens must be >= 1, got {max_prompt_tokens}")
    env = make_environment(cfg.environment.name, **cfg.environment.params)
    splits = build_splits(env, cfg.environment)
    system = env.system_prompt()
    all_prompts = [prompt_messages(system, t) for tasks in splits.values() for t in tasks]
    schemas = [tool_schema(spec) for spec in env.tool_specs()]
    lengths: dict[str, Any] = (
        {
            "prompt": prompt_length_bound(all_prompts, schemas),
            "source": "character bound of the longest prompt and the tool schemas",
        }
        if max_prompt_tokens is None
        else {"prompt": max_prompt_tokens, "source": "given by --max-prompt-tokens"}
    )
    overrides = _fixed_overrides(cfg)
    rules = _rules(cfg, overrides, lengths)
    fates: list[KeyFate] = []
    refusals: list[str] = []
    for key, value in config_leaves(cfg.to_dict()):
        rule = rules.get(key)
        if rule is None:
            fates.append(
                KeyFate(
                    key, value, DROPPED, "(none)", "no verl mapping rule in this miniverl version"
                )
            )
            continue
        out = rule(value, cfg)
        if isinstance(out, str):
            refusals.append(out)
        else:
            fates.append(KeyFate(key, value, out.status, out.verl, out.note))
    if refusals:
        raise ConfigError(
            "this recipe cannot be exported to verl without changing its objective:\n"
            + "\n".join(f"  - {r}" for r in refusals),
            hint="override the listed keys (miniverl export-verl recipe.yaml key=value ...) or keep the experiment in miniverl",
        )
    if not splits["eval" if cfg.eval.split == "eval" else "test"]:
        raise ConfigError(
            f"eval.split {cfg.eval.split!r} has no tasks, but verl needs data/val.parquet rows",
            hint="set environment.eval_tasks (or test_tasks) > 0",
        )
    return ExportPlan(
        overrides=overrides,
        fates=fates,
        tool_specs=env.tool_specs(),
        environment=cfg.environment.name,
        environment_params=dict(cfg.environment.params),
        splits=splits,
    )


# -- rows and files ------------------------------------------------------------------------


def dataset_rows(cfg: RunConfig, plan: ExportPlan, split: str) -> list[dict[str, Any]]:
    """verl RLHFDataset rows for one miniverl split, in split order."""
    env = make_environment(cfg.environment.name, **cfg.environment.params)
    system = env.system_prompt()
    params_json = json.dumps(plan.environment_params, sort_keys=True)
    rows = []
    for index, task in enumerate(plan.splits[split]):
        create_kwargs = {
            "task_id": task.task_id,
            "prompt": task.prompt,
            "answer": task.answer,
            "difficulty": task.difficulty,
            "split": task.split,
            "data_json": json.dumps(dict(task.data), sort_keys=True),
        }
        rows.append(
            {
                "data_source": plan.environment,
                "agent_name": AGENT_LOOP,
                "prompt": prompt_messages(system, task),
                "ability": "tool_use",
                "reward_model": {"style": "rule", "ground_truth": task.answer},
                "extra_info": {
                    "index": index,
                    "split": task.split,
                    "task_id": task.task_id,
                    "difficulty": task.difficulty,
                    "environment_params_json": params_json,
                    "need_tools_kwargs": True,
                    "tools_kwargs": {
                        spec.name: {"create_kwargs": create_kwargs} for spec in plan.tool_specs
                    },
                },
            }
        )
    return rows


def _require_pyarrow() -> Any:
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise BackendError(
            "pyarrow is not installed (needed to write verl's parquet datasets)",
            hint=install_hint("verl-export"),
        ) from exc
    return pq


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    pq = _require_pyarrow()
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows), path)


def tools_yaml(plan: ExportPlan) -> str:
    payload = {
        "tools": [
            {
                "class_name": TOOL_CLASS,
                "config": {
                    "type": "native",
                    "environment": plan.environment,
                    "environment_params": plan.environment_params,
                },
                "tool_schema": tool_schema(spec),
            }
            for spec in plan.tool_specs
        ]
    }
    return (
        "# verl tool config written by miniverl export-verl; the class wraps miniverl's environment.\n"
        + yaml.safe_dump(payload, sort_keys=False)
    )


REWARD_PY = '''"""verl custom_reward_function written by miniverl export-verl: the environment's exact verifier."""

from miniverl.export.verl_tool import compute_score

__all__ = ["compute_score"]
'''


def run_script(plan: ExportPlan) -> str:
    args = " \\\n    ".join(shlex.quote(s) for s in plan.override_strings())
    return f"""#!/usr/bin/env bash
# Written by miniverl {__version__} export-verl for verl=={VERL_VERSION}.
# Needs, in verl's own environment: verl=={VERL_VERSION} with vLLM, and miniverl importable
# (pip install --no-deps miniverl) for the tool adapter and the reward function.
# Scale out by appending overrides, e.g. trainer.n_gpus_per_node=8 distillation.n_gpus_per_node=8
set -euo pipefail
export {EXPORT_DIR_ENV}="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
exec python3 -m verl.trainer.main_ppo \\
    {args} \\
    "$@"
"""


GUARANTEES = f"""\
## miniverl guarantees that do NOT carry over

- **Policy-version / fingerprint contract.** miniverl refuses a teacher target produced
  under another policy version (`cache.strict_policy_version`, the cache fingerprint and
  `StaleCacheError`). verl recomputes teacher log-probs each step and has no such check;
  with asynchronous or off-policy trainers the staleness is whatever verl's scheduler makes it.
- **Bucketed tail divergence vs verl's clamped top-k.** miniverl's bucketed loss keeps the
  teacher's top-k *plus one tail bucket* holding the remaining mass, so forward KL is a true
  divergence between two distributions. verl's `forward_kl_topk` uses the top-k only (the
  masses do not sum to 1) and clamps the per-token loss at >= 0; `reverse_kl` becomes the
  single-sample `k3` estimator at the sampled token. Loss values are not comparable number
  for number.
- **Exact resume.** miniverl resumes bit-for-bit (optimizer, RNG streams, cursor, cache
  state). verl checkpoints model/optimizer/dataloader but does not promise an identical
  continuation (vLLM sampling, Ray scheduling).
- **Span-typed provenance.** miniverl records which tokens are model-generated, tool
  output, prompt or parse error, trains only on model spans, and refuses a context token
  as a target. verl keeps a response mask (tool tokens masked) but no per-span provenance,
  no trajectory schema, and no alignment check between student and teacher renders.
- **Protocol rendering.** miniverl renders tool results as a user turn wrapped in
  `{TOOL_RESULT_OPEN}`; verl renders them as `tool` messages through the model's chat template
  (the JSON inside is identical). Unknown tools and invalid JSON are answered by verl's
  ToolAgentLoop with its own messages before the adapter sees the call.
- **Stop rules and evaluation.** `rollout.max_parse_errors`, `rollout.max_repeated_calls`
  and the per-turn token bound have no verl equivalent; an episode ends when a turn has no
  tool call or the response budget is spent.
"""


def mapping_markdown(plan: ExportPlan, recipe: str) -> str:
    def cell(v: Any) -> str:
        text = json.dumps(v) if not isinstance(v, str) else v
        return text.replace("|", "\\|")

    lines = [
        f"# miniverl -> verl {VERL_VERSION} mapping for `{recipe}`",
        "",
        f"Written by miniverl {__version__} `export-verl`. Every recipe key is listed once with",
        "its fate: **mapped** (it became the verl override named), **dropped** (no verl",
        "equivalent; the value is NOT used) or **not applicable** (inactive for this recipe).",
        "",
        "## Dropped keys",
        "",
    ]
    dropped = plan.dropped()
    lines += [f"- `{f.key}` = `{cell(f.value)}` — {f.note}" for f in dropped] or ["- (none)"]
    lines += [
        "",
        "## Every recipe key",
        "",
        "| recipe key | value | fate | verl | note |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| `{f.key}` | `{cell(f.value)}` | {f.status} | {cell(f.verl)} | {cell(f.note)} |"
        for f in plan.fates
    ]
    fixed = _fixed_overrides_keys()
    lines += [
        "",
        "## Settings the export always makes",
        "",
        "| verl key | value | why |",
        "|---|---|---|",
    ]
    lines += [
        f"| `{k}` | `{cell(hydra_value(plan.overrides[k]))}` | {cell(FIXED_NOTES.get(k, ''))} |"
        for k in fixed
    ]
    lines += ["", GUARANTEES]
    return "\n".join(lines)


def _fixed_overrides_keys() -> list[str]:
    return list(_fixed_overrides(RunConfig()).keys())


def export_verl(
    cfg: RunConfig,
    out: Path,
    *,
    recipe: str = "<recipe>",
    force: bool = False,
    max_prompt_tokens: int | None = None,
) -> ExportPlan:
    """Plan, then write every file into a temporary directory renamed to ``out`` at the end.

    A refused recipe or a missing pyarrow raises before anything exists at ``out``.
    """
    plan = plan_export(cfg, max_prompt_tokens=max_prompt_tokens)
    _require_pyarrow()
    out = Path(out)
    occupied = out.is_file() or (out.is_dir() and any(out.iterdir()))
    if occupied and not force:
        raise ConfigError(
            f"{out} already exists and is not empty",
            hint="choose another --out or pass --force to replace it",
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "data").mkdir()
        write_parquet(dataset_rows(cfg, plan, "train"), tmp / "data" / "train.parquet")
        write_parquet(dataset_rows(cfg, plan, cfg.eval.split), tmp / "data" / "val.parquet")
        (tmp / "tools.yaml").write_text(tools_yaml(plan), encoding="utf-8")
        (tmp / "miniverl_reward.py").write_text(REWARD_PY, encoding="utf-8")
        overrides_doc = {
            "verl_version": VERL_VERSION,
            "config_name": "ppo_trainer",
            "export_dir_env": EXPORT_DIR_ENV,
            "overrides": plan.override_strings(),
        }
        (tmp / "overrides.yaml").write_text(
            yaml.safe_dump(overrides_doc, sort_keys=False, width=1000), encoding="utf-8"
        )
        script = tmp / "run_verl.sh"
        script.write_text(run_script(plan), encoding="utf-8")
        script.chmod(0o755)
        (tmp / "recipe.resolved.yaml").write_text(cfg.to_yaml(), encoding="utf-8")
        (tmp / "MAPPING.md").write_text(mapping_markdown(plan, recipe), encoding="utf-8")
        publish_modes(tmp)
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return plan


__all__ = [
    "ExportPlan",
    "dataset_rows",
    "export_verl",
    "hydra_value",
    "mapping_markdown",
    "plan_export",
    "prompt_length_bound",
    "tool_schema",
]
