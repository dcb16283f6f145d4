"""The backend contract every model implementation satisfies (docs/design.md §2.1).

The load-bearing rule: ``hidden_states_at`` returns ``[len(positions), H]`` and
``project`` maps ``[N, H] -> [N, V]``. Nothing ever builds ``[batch, seq_len, V]``
logits. Schedulers, checkpoints and memory policy do not live in a backend.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from miniverl.schemas.text import TokenizerLike

FinishReason = Literal["stop_sequence", "eos", "max_new_tokens"]


@dataclass(frozen=True)
class GenerationResult:
    """One generation call.

    ``token_ids`` are the sampled ids verbatim (including a stop sequence's tokens and,
    when it was sampled, the EOS id); ``text`` is ``decode(token_ids)`` minus an EOS.
    ``num_generated`` counts every sampled id, so rollout accounting is exact.
    """

    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    stop_sequence: str | None = None
    num_prompt_tokens: int = 0

    @property
    def num_generated(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class BackendCapabilities:
    """What a built backend is, recorded in the manifest."""

    backend: str
    model_id: str
    revision: str | None
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_parameters: int
    num_trainable_parameters: int
    precision: str
    quantization: str
    lora: bool
    kv_cache: bool
    can_offload: bool
    device: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PaddedTrajectoryBatch:
    """Several trajectories right-padded into one backbone forward.

    Padding is mask-isolated: padded positions get attention 0 and sit after every real
    token, so causal attention never lets a real position see one.

    - ``input_ids``: ``[B, T]`` long.
    - ``attention_mask``: ``[B, T]`` long (1 real, 0 pad).
    - ``row_index`` / ``position_index``: ``[N]`` long; entry i gathers the hidden state
      of row ``row_index[i]`` at position ``position_index[i]``. Rows appear in order and
      positions increase within a row, so the gathered ``[N, H]`` is the row-wise
      concatenation of each trajectory's selected prediction positions.
    - ``row_sizes``: number of gathered entries per row.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    row_index: torch.Tensor
    position_index: torch.Tensor
    row_sizes: list[int]

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_positions(self) -> int:
        return int(self.row_index.shape[0])

    @property
    def flat_index(self) -> torch.Tensor:
        """``[N]`` indices into the flattened ``[B * T]`` sequence axis."""
        return self.row_index * int(self.input_ids.shape[1]) + self.position_index


@runtime_checkable
class CausalLMBackend(Protocol):
    """A causal LM that can sample, expose gathered hidden states and project them.

    Optional: ``generate_batch(prompts, *, max_new_tokens, seeds, temperature, top_p,
    stop_sequences) -> list[GenerationResult]``, whose row ``r`` equals ``generate`` of
    ``prompts[r]`` with ``seeds[r]`` (both built-in backends have it; ``RolloutRunner``
    falls back to one episode at a time without it). A backend whose ``generate_batch`` also
    takes ``prefix_cache=`` (a ``models.sampling.PrefixCache``) sets ``supports_prefix_cache
    = True``; the runner then keeps the KV cache across turns and prefills only new ids.
    """

    tokenizer: TokenizerLike
    capabilities: BackendCapabilities

    @property
    def device(self) -> str: ...

    def generate(
        self,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_sequences: tuple[str, ...] = (),
    ) -> GenerationResult: ...

    def hidden_states_at(
        self, token_ids: list[int], positions: list[int], *, with_grad: bool = False
    ) -> torch.Tensor:
        """Final-norm hidden states ``[len(positions), H]`` of one sequence."""
        ...

    def hidden_states_at_batch(
        self, batch: PaddedTrajectoryBatch, *, with_grad: bool = False
    ) -> torch.Tensor:
        """Final-norm hidden states ``[batch.num_positions, H]`` of a padded batch."""
        ...

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head: ``[N, H] -> [N, V]`` logits."""
        ...

    def set_train(self, mode: bool) -> None: ...

    def trainable_parameters(self) -> list[torch.nn.Parameter]: ...

    def trainable_state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_trainable_state_dict(
        self, state: dict[str, torch.Tensor], *, strict: bool = True
    ) -> None: ...

    def to_device(self, device: str) -> None: ...

    def release(self) -> None: ...
