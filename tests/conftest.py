"""Shared fixtures. Builders live in ``tests/helpers.py`` (``from helpers import ...``)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

_TESTS_DIR = Path(__file__).resolve().parent
if str(_TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(_TESTS_DIR))

from hypothesis import HealthCheck, settings  # noqa: E402

import helpers  # noqa: E402

# Property tests stay small and deterministic: a few seconds per file, no flaky deadline.
settings.register_profile(
    "miniverl",
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,  # no .hypothesis/ directory written into the tree
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("miniverl")


@pytest.fixture(autouse=True, scope="session")
def _toy_teacher_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Fitted toy teachers are cached in a session temp dir, never in the user's ~/.cache.

    Tests with identical teacher inputs reuse one fit (``toy_teacher_reused``), which is
    also how users see it; tests of the cache itself point it at their own directory.
    """
    os.environ["MINIVERL_CACHE_DIR"] = str(tmp_path_factory.mktemp("miniverl-cache"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests without CUDA and ``browser`` tests without chromium."""
    browser_items = [item for item in items if item.get_closest_marker("browser") is not None]
    if browser_items and not any(shutil.which(b) for b in ("chromium", "chromium-browser")):
        skip_browser = pytest.mark.skip(reason="needs the Debian chromium package")
        for item in browser_items:
            item.add_marker(skip_browser)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    try:
        import torch

        has_cuda = bool(torch.cuda.is_available())
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is false)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module of tiny-tensor tests.

    Waking a second OpenMP thread per operation costs far more than it saves on these
    tensors, and on a busy 2-core machine it made such modules ~6x slower. Modules opt in
    with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded toy tokenizer."""
    return helpers.toy_tokenizer()


@pytest.fixture
def calculator_env():
    """A fresh ``calculator`` environment (compact prompt)."""
    return helpers.calculator()


@pytest.fixture(scope="session")
def easy_tasks():
    return helpers.calculator_tasks(4, difficulty="easy")


@pytest.fixture(scope="session")
def oracle_traj():
    """One oracle trajectory of an easy calculator task (validated, read-only)."""
    return helpers.oracle_trajectory()


@pytest.fixture
def oracle_file(tmp_path: Path) -> Path:
    """A JSONL file of three oracle trajectories written by ``write_trajectories``."""
    path = tmp_path / "trajectories.jsonl"
    helpers.write_oracle_file(path, 3)
    return path


@pytest.fixture(scope="session")
def src_dir() -> Path:
    return helpers.SRC_DIR
