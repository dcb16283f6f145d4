"""``benchmarks/smollm2_chain_headroom.py`` measures the first ``per_k`` validation tasks of
each chain length, in split order, and refuses a split that cannot supply them."""

from __future__ import annotations

import pytest

from helpers import load_benchmark_script
from miniverl.environments.base import Task
from miniverl.errors import ConfigError


def _script():
    return load_benchmark_script("smollm2_chain_headroom")


def _task(i: int, k: int | None) -> Task:
    return Task(f"t{i}", "p", "0", "easy", split="eval", data={} if k is None else {"k": k})


def test_first_tasks_of_each_k_in_split_order() -> None:
    ks = [1, 3, 2, 1, None, 2, 1, 3, 5, 2]
    picked = _script().tasks_per_k([_task(i, k) for i, k in enumerate(ks)], 2, (1, 2, 3))
    assert {k: [t.task_id for t in v] for k, v in picked.items()} == {
        1: ["t0", "t3"],
        2: ["t2", "t5"],
        3: ["t1", "t7"],
    }


def test_too_few_tasks_of_a_length_is_a_config_error() -> None:
    tasks = [_task(i, k) for i, k in enumerate([1, 2, 1, 2, 3])]
    with pytest.raises(ConfigError, match=r"chain length \[3\]") as info:
        _script().tasks_per_k(tasks, 2, (1, 2, 3))
    assert "--eval-tasks" in info.value.hint
