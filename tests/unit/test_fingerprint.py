"""The policy fingerprint changes with any weight and with nothing else; the strict check uses it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from miniverl.errors import OffPolicyError, StaleCacheError
from miniverl.models.fingerprint import backend_fingerprint, tensor_fingerprint
from miniverl.training.sources import check_on_policy


def _weights() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(7, 5, generator=g), torch.randn(3, generator=g).bfloat16(), torch.zeros(0)]


def test_fingerprint_changes_with_every_single_weight_and_bit() -> None:
    base = tensor_fingerprint(_weights())
    assert base == tensor_fingerprint(_weights())
    for index in range(2):
        for position in range(_weights()[index].numel()):
            changed = _weights()
            flat = changed[index].view(-1)
            bits = flat.view(torch.int16 if flat.dtype == torch.bfloat16 else torch.int32)
            bits[position] ^= 1  # the lowest mantissa bit
            assert tensor_fingerprint(changed) != base, (index, position)


def test_fingerprint_depends_on_order_shape_dtype_and_count() -> None:
    a, b, c = _weights()
    base = tensor_fingerprint([a, b, c])
    assert tensor_fingerprint([b, a, c]) != base
    assert tensor_fingerprint([a.reshape(5, 7), b, c]) != base
    assert tensor_fingerprint([a, b.float(), c]) != base
    assert tensor_fingerprint([a, b]) != base
    assert tensor_fingerprint([]) != tensor_fingerprint([torch.zeros(0)])


def test_backend_without_trainable_parameters_has_no_fingerprint() -> None:
    class Frozen:
        def trainable_parameters(self) -> list[torch.Tensor]:
            return []

    assert backend_fingerprint(object()) is None
    assert backend_fingerprint(Frozen()) == tensor_fingerprint([])


@dataclass
class _Sample:
    rollout_fingerprint: str | None
    target_fingerprint: str | None
    rollout_policy_version: int = 3
    trajectory_id: str = "t:v3"


def test_strict_check_names_the_rollout_and_both_fingerprints() -> None:
    check_on_policy([_Sample("A", "A")], "A")
    with pytest.raises(
        OffPolicyError, match=r"'t:v3' .*policy fingerprint B, but .* has fingerprint A"
    ):
        check_on_policy([_Sample("B", "B")], "A")
    with pytest.raises(
        OffPolicyError, match="teacher targets of 't:v3' were produced for policy fingerprint C"
    ):
        check_on_policy([_Sample("A", "C")], "A")
    with pytest.raises(StaleCacheError):
        check_on_policy([_Sample(None, None)], None)


def test_strict_check_refuses_targets_without_a_fingerprint_for_a_fingerprinted_rollout() -> None:
    """Targets that carry no fingerprint prove nothing about the weights they were scored
    for; a rollout that has one must be matched by exactly that fingerprint."""
    with pytest.raises(
        OffPolicyError, match="teacher targets of 't:v3' were produced for policy fingerprint None"
    ):
        check_on_policy([_Sample("A", None)], "A")
    with pytest.raises(OffPolicyError, match="teacher targets"):
        check_on_policy([_Sample("A", "A"), _Sample("A", None, trajectory_id="t:v4")], "A")
