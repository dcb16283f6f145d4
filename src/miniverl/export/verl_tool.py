"""A miniverl environment as a verl tool, and its verifier as a verl reward function.

``miniverl export-verl`` writes a ``tools.yaml`` whose ``class_name`` is
``miniverl.export.verl_tool.MiniverlEnvTool`` and a ``miniverl_reward.py`` that
re-exports :func:`compute_score`. Both run inside *verl's* Python environment, which
needs miniverl importable there (``pip install --no-deps miniverl``: only the
environment and protocol modules are used, which need pydantic and PyYAML).

verl is never imported at module level: ``MiniverlEnvTool`` is built on first attribute
access (PEP 562 ``__getattr__``), so this module imports without verl and the pure
functions :func:`execute_call` and :func:`compute_score` are tested in miniverl's own
environment. The tool returns exactly the JSON miniverl's agent loop puts inside
``<tool_result>`` (:meth:`ToolResult.observation_text`), so the error strings the
student reads are the same in both frameworks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from miniverl.environments.base import Task, ToolCall, ToolEnvironment, ToolResult
from miniverl.environments.registry import make_environment
from miniverl.schemas.text import FINAL_CLOSE, FINAL_OPEN

TOOL_CLASS_NAME = "MiniverlEnvTool"


def task_from_create_kwargs(kwargs: Mapping[str, Any]) -> Task | None:
    """Rebuild the episode's :class:`Task` from a parquet row's ``create_kwargs`` (None if absent)."""
    if not kwargs or "task_id" not in kwargs:
        return None
    return Task(
        task_id=str(kwargs["task_id"]),
        prompt=str(kwargs.get("prompt", "")),
        answer=str(kwargs.get("answer", "")),
        difficulty=kwargs.get("difficulty", "easy"),
        split=str(kwargs.get("split", "train")),
        data=json.loads(kwargs.get("data_json") or "{}"),
    )


def new_episode(
    environment: str, params: Mapping[str, Any], create_kwargs: Mapping[str, Any] | None
) -> ToolEnvironment:
    """A fresh environment, reset on the row's task when the row carries one."""
    env = make_environment(environment, **dict(params))
    task = task_from_create_kwargs(create_kwargs or {})
    if task is not None:
        env.reset(task)
    return env


def execute_call(env: ToolEnvironment, tool_name: str, arguments: Any) -> ToolResult:
    """One call through the environment, exactly as miniverl's agent loop makes it.

    verl hands over whatever JSON the model wrote as arguments; miniverl's parser refuses
    anything but an object before the environment sees it, so this does the same, with the
    parser's message.
    """
    if not isinstance(arguments, Mapping):
        return ToolResult(ok=False, error='tool call "arguments" must be a JSON object')
    return env.step(ToolCall(tool_name, dict(arguments)))


def last_final_answer(solution_str: str) -> str | None:
    """The text of the last closed ``<final>`` block of a decoded response, or None."""
    end = solution_str.rfind(FINAL_CLOSE)
    if end < 0:
        return None
    start = solution_str.rfind(FINAL_OPEN, 0, end)
    if start < 0:
        return None
    return solution_str[start + len(FINAL_OPEN) : end].strip()


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    **_: Any,
) -> float:
    """verl ``custom_reward_function``: the environment's exact verifier (1.0 solved, else 0.0).

    ``data_source`` is the environment name; its constructor params travel in
    ``extra_info["environment_params_json"]``. No ``<final>`` block scores 0.0, as an
    episode without a final answer does in miniverl.
    """
    info = dict(extra_info or {})
    params = json.loads(info.get("environment_params_json") or "{}")
    answer = last_final_answer(solution_str)
    if answer is None:
        return 0.0
    env = make_environment(data_source, **params)
    task = Task(
        task_id=str(info.get("task_id", "verl")),
        prompt="",
        answer=str(ground_truth),
        difficulty=info.get("difficulty", "easy"),
    )
    return float(env.verify(task, answer).reward)


def _build_tool_class() -> type:
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import ToolResponse

    class MiniverlEnvTool(BaseTool):
        """verl ``BaseTool`` over one miniverl environment tool.

        ``config`` (from ``tools.yaml``): ``environment`` (registered name) and
        ``environment_params``. verl's ToolAgentLoop creates and releases an instance
        around every single call, so per-episode environment state does not persist
        across calls (the calculator has none).
        """

        def __init__(self, config: dict, tool_schema: Any) -> None:
            super().__init__(config, tool_schema)
            self._environment = str(config["environment"])
            self._params = dict(config.get("environment_params") or {})
            self._episodes: dict[str, ToolEnvironment] = {}

        async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
            instance_id, response = await super().create(instance_id)
            self._episodes[instance_id] = new_episode(
                self._environment, self._params, kwargs.get("create_kwargs")
            )
            return instance_id, response

        async def execute(
            self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
        ) -> tuple[Any, float, dict]:
            env = self._episodes.get(instance_id)
            if env is None:
                env = new_episode(self._environment, self._params, None)
            result = execute_call(env, self.name, parameters)
            return ToolResponse(text=result.observation_text()), 0.0, {"ok": result.ok}

        async def release(self, instance_id: str, **kwargs: Any) -> None:
            self._episodes.pop(instance_id, None)

    MiniverlEnvTool.__module__ = __name__
    return MiniverlEnvTool


_BUILT: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    if name == TOOL_CLASS_NAME:
        if name not in _BUILT:
            _BUILT[name] = _build_tool_class()
        return _BUILT[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TOOL_CLASS_NAME",
    "compute_score",
    "execute_call",
    "last_final_answer",
    "new_episode",
    "task_from_create_kwargs",
]
