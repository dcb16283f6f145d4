"""``benchmarks/prefill_ratio.py`` on the toy backend: the three arms decode the same
episodes, and the counts order as the strategies promise (the shared prefix saves exactly
``(rows - 1) * P`` ids of the first round over per-row incremental prefill)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import load_benchmark_script

pytest.importorskip("torch")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _script():
    return load_benchmark_script("prefill_ratio")


def test_toy_arms_agree_and_the_shared_prefix_counts_once(tmp_path: Path) -> None:
    from miniverl.environments.registry import make_environment
    from miniverl.models.tokenizers import ToyTokenizer

    bench = _script()
    out = tmp_path / "ratio.json"
    assert bench.main(["--backend", "toy", "--tasks", "4", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    arms = result["arms"]
    assert result["identical_trajectories"] is True
    assert len({a["episode_tokens"] for a in arms.values()}) == 1
    assert arms["full"]["real_tokens"] > arms["per_row"]["real_tokens"]
    assert arms["per_row"]["real_per_length"] <= 1.0
    system = ToyTokenizer().encode(make_environment("calc_chain", spare_turns=1).system_prompt())
    saved = arms["per_row"]["real_tokens"] - arms["shared"]["real_tokens"]
    assert saved % 3 == 0 and saved // 3 >= len(system)
    assert arms["shared"]["real_per_length"] <= bench.TARGET
