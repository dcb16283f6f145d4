"""Torch threads of a teacher fit: a toy fit takes torch's count, the run keeps its own."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from miniverl.lab.config import load_recipe  # noqa: E402
from miniverl.lab.teachers.prepare import FitContext, fit_threads  # noqa: E402
from miniverl.training.resolve import resolve_cpu_threads  # noqa: E402

RECIPE = "recipes/toy_calculator.yaml"


def test_a_toy_fit_under_auto_takes_torchs_count_where_the_toy_run_takes_one() -> None:
    config = load_recipe(RECIPE, [])
    assert fit_threads(config, "cpu", 4) == 4
    assert resolve_cpu_threads(config, device="cpu", torch_threads=4)[0] == 1


@pytest.mark.parametrize("threads", [1, 3])
def test_a_toy_fit_keeps_an_explicit_run_cpu_threads(threads: int) -> None:
    config = load_recipe(RECIPE, [f"run.cpu_threads={threads}"])
    assert fit_threads(config, "cpu", 4) == threads


def test_the_fit_context_sets_torchs_threads_from_fit_threads() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        FitContext.of(load_recipe(RECIPE, []))
        assert torch.get_num_threads() == 2
        FitContext.of(load_recipe(RECIPE, ["run.cpu_threads=1"]))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
