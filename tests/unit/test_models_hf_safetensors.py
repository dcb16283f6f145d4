"""Hugging Face loads are safetensors-only: a pickled ``pytorch_model.bin`` is never loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from miniverl.errors import BackendError  # noqa: E402
from miniverl.models.hf import HFBackend  # noqa: E402
from miniverl.models.tiny_hf import build_tiny_hf_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_hf_model_load_refuses_a_pickle_only_checkpoint(tmp_path: Path) -> None:
    directory = build_tiny_hf_checkpoint(tmp_path / "tiny", seed=0)
    weights = directory / "model.safetensors"
    torch.save(load_file(str(weights)), directory / "pytorch_model.bin")  # test fixture only
    weights.unlink()
    with pytest.raises(BackendError, match=r"no file named model\.safetensors"):
        HFBackend(directory)
