"""A small, real decoder-only transformer and the backend that wraps it.

The toy backend exists so the whole OPD pipeline runs on a laptop CPU with no download:
same contract, same generation loop and same losses as the Hugging Face backend, on a
model of about 100k parameters. The decoder is deliberately ordinary (nanoGPT/Llama
style) so it can be read in one sitting:

    ids -> embedding -> L x [x + attn(rmsnorm(x)); x + swiglu(rmsnorm(x))] -> rmsnorm -> head

with rotary position embeddings, causal multi-head attention over a KV cache, a SwiGLU MLP,
a tied or untied LM head, and optional LoRA on the seven attention/MLP projections.
Shapes and presets are ``models/toy_config.py``; fitting the decoder into a competent toy
teacher is ``lab/teachers/toy_fit.py``.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from miniverl.errors import BackendError
from miniverl.models.base import BackendCapabilities, GenerationResult, PaddedTrajectoryBatch
from miniverl.models.sampling import (
    PrefixCache,
    check_right_padded,
    eval_mode,
    gather_positions,
    load_parameters,
    load_trainable_state,
    position_tensor,
    run_batched_generation,
    run_generation,
    trainable_state,
)
from miniverl.models.toy_config import ToyModelConfig

if TYPE_CHECKING:
    from miniverl.schemas.text import TokenizerLike


# ------------------------------------------------------------------------------ the KV cache


@dataclass
class _KVBuffers:
    """Per layer key and value buffers ``[B, num_heads, capacity, head_dim]``; ``length``
    slots are written (by the cache that extended them furthest)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]


def _regrown(buffer: torch.Tensor, length: int, capacity: int) -> torch.Tensor:
    """A fresh ``[B, heads, capacity, d]`` buffer holding ``buffer``'s first ``length`` slots."""
    b, heads, _, d = buffer.shape
    out = buffer.new_empty((b, heads, capacity, d))
    out[:, :, :length] = buffer[:, :, :length]
    return out


class KVCache:
    """Keys and values of every layer, ``[B, num_heads, length, head_dim]``, in buffers with spare slots.

    A decode step writes its one new slot per layer in place; concatenating instead copies
    every layer's whole cache once per sampled id, O(T^2) bytes an episode. ``cache[i]`` is
    layer ``i``'s ``(keys, values)``: views ``buffer[:, :, :length]``, which attention reads
    exactly as it reads contiguous tensors (``tests/unit/test_models_toy.py``). A cache's
    length never changes: a forward returns a
    new cache over the same buffers. Extending a cache whose buffers another cache has
    already extended (two continuations of one prefix) copies them first, so neither
    continuation can see the other's slots.
    """

    def __init__(self, buffers: _KVBuffers, length: int) -> None:
        self._buffers = buffers
        self._length = length

    @classmethod
    def of(cls, layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> KVCache:
        """A cache over exactly these per-layer ``(keys, values)`` (no copy, no spare slots)."""
        keys = [k for k, _ in layers]
        length = keys[0].shape[2]
        return cls(_KVBuffers(keys, [v for _, v in layers], length), length)

    @property
    def length(self) -> int:
        """Slots per row (cached positions, padding included)."""
        return self._length

    def __len__(self) -> int:
        return len(self._buffers.keys)

    def __getitem__(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = self._length
        return self._buffers.keys[layer][:, :, :n], self._buffers.values[layer][:, :, :n]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return (self[i] for i in range(len(self)))

    def writable(self, new: int) -> _KVBuffers:
        """Buffers that take slots ``length .. length + new - 1`` without touching another cache's.

        Grown to twice what is needed (at least 32 spare slots) when short, so a decode
        of ``T`` ids copies the cache O(log T) times.
        """
        buffers, needed = self._buffers, self._length + new
        if buffers.length == self._length and needed <= buffers.capacity:
            return buffers
        capacity = needed + max(needed, 32)
        return _KVBuffers(
            [_regrown(k, self._length, capacity) for k in buffers.keys],
            [_regrown(v, self._length, capacity) for v in buffers.values],
            self._length,
        )


class _LayerSlots(NamedTuple):
    """Where one layer's attention writes the keys and values of its new positions."""

    buffers: _KVBuffers
    layer: int
    offset: int

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[B, heads, t, d]`` at slots ``offset ..``; the layer's keys and values so far."""
        end = self.offset + keys.shape[2]
        k_buf, v_buf = self.buffers.keys[self.layer], self.buffers.values[self.layer]
        k_buf[:, :, self.offset : end] = keys
        v_buf[:, :, self.offset : end] = values
        return k_buf[:, :, :end], v_buf[:, :, :end]


# ------------------------------------------------------------------------------- the model


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).to(x.dtype)


class ToyLinear(nn.Module):
    """A bias-free linear layer with an optional LoRA update.

    ``y = x W^T + (alpha / r) * dropout(x) A^T B^T`` with ``A: [r, in]``, ``B: [out, r]``.
    ``B`` starts at zero, so enabling adapters does not change the model until it trains.
    """

    def __init__(
        self, in_features: int, out_features: int, *, rank: int, alpha: float, dropout: float
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.rank = rank
        if rank > 0:
            self.lora_A = nn.Parameter(torch.empty(rank, in_features))
            self.lora_B = nn.Parameter(torch.zeros(out_features, rank))
            self.scaling = alpha / rank
            self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @classmethod
    def for_config(cls, cfg: ToyModelConfig, in_features: int, out_features: int) -> ToyLinear:
        """A projection carrying ``cfg``'s LoRA settings."""
        return cls(
            in_features,
            out_features,
            rank=cfg.lora_rank,
            alpha=cfg.lora_alpha,
            dropout=cfg.lora_dropout,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.rank == 0:
            return y
        update = F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B)
        return y + update * self.scaling


class Rotary(nn.Module):
    """Rotary position embedding (half-split convention, as in Llama/Qwen).

    The cos/sin table covers ``max_seq_len`` positions and is extended on demand, so a long
    rollout never fails on position alone.
    """

    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._build(max_seq_len)

    def _build(self, length: int) -> None:
        """The tables for ``length`` positions; ``sin`` carries the rotation's signs.

        Built outside inference mode even when a rollout extends them, so that a later
        training forward may save slices of them for backward.
        """
        with torch.inference_mode(False):
            t = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
            freqs = torch.outer(t, self.inv_freq)
            emb = torch.cat([freqs, freqs], dim=-1)
            half = emb.shape[-1] // 2
            sin = emb.sin()
            sin[:, :half] = -sin[:, :half]
            self.register_buffer("cos", emb.cos(), persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def tables(
        self, offset: int, t: int, positions: torch.Tensor | None, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, signed sin)`` for positions ``offset .. offset + t - 1``: ``[t, head_dim]``.

        ``positions`` (``[B, t]`` long) overrides that with each row's own positions
        (``[B, 1, t, head_dim]``), which is how a left-padded batch keeps every row's real
        tokens at positions ``0, 1, ...``. Every layer and both q and k share one table, so
        a forward gathers it once.
        """
        end = offset + t if positions is None else int(positions.max()) + 1
        if end > self.cos.shape[0]:
            self._build(max(end, 2 * self.cos.shape[0]))
        if positions is None:
            return self.cos[offset:end].to(dtype), self.sin[offset:end].to(dtype)
        return (
            self.cos[positions].unsqueeze(1).to(dtype),
            self.sin[positions].unsqueeze(1).to(dtype),
        )

    @staticmethod
    def rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Rotate ``x: [B, heads, t, head_dim]`` by a :meth:`tables` pair.

        ``x * cos + cat(-x2, x1) * sin`` with the halves swapped by one ``roll`` and the
        minus sign kept in the table: ``x2 * (-s)`` rounds exactly as ``-(x2 * s)``, so this
        is the textbook rotation bit for bit, in three fewer ops per call.
        """
        cos, signed_sin = rope
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin

    def forward(
        self, x: torch.Tensor, offset: int, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Rotate ``x: [B, heads, t, head_dim]`` as positions ``offset .. offset + t - 1``
        (or ``positions``, see :meth:`tables`)."""
        return self.rotate(x, self.tables(offset, x.shape[-2], positions, x.dtype))


class Attention(nn.Module):
    """Causal multi-head self-attention that appends to and reads from a KV cache."""

    def __init__(self, cfg: ToyModelConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.q_proj = ToyLinear.for_config(cfg, h, h)
        self.k_proj = ToyLinear.for_config(cfg, h, h)
        self.v_proj = ToyLinear.for_config(cfg, h, h)
        self.o_proj = ToyLinear.for_config(cfg, h, h)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        past: _LayerSlots | None,
        allowed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``rope``: the forward's :meth:`Rotary.tables`; ``past``: where the cached keys and
        values are and the new ones go; ``allowed``: ``[B, 1, t, t_past + t]`` bool
        attention mask of a padded batch."""
        b, t, h = x.shape

        def heads(proj: ToyLinear) -> torch.Tensor:
            return proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

        offset = 0 if past is None else past.offset
        q = Rotary.rotate(heads(self.q_proj), rope)
        k = Rotary.rotate(heads(self.k_proj), rope)
        v = heads(self.v_proj)
        if past is not None:
            k, v = past.append(k, v)
        if allowed is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        elif t == 1:
            y = F.scaled_dot_product_attention(q, k, v)
        elif offset == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            allowed = torch.ones(t, offset + t, dtype=torch.bool, device=x.device)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed.tril(diagonal=offset))
        return self.o_proj(y.transpose(1, 2).reshape(b, t, h)), (k, v)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: ToyModelConfig) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = ToyLinear.for_config(cfg, h, i)
        self.up_proj = ToyLinear.for_config(cfg, h, i)
        self.down_proj = ToyLinear.for_config(cfg, i, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block: attention, then MLP."""

    def __init__(self, cfg: ToyModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        past: _LayerSlots | None,
        allowed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        attn_out, kv = self.attn(self.attn_norm(x), rope, past, allowed)
        x = x + attn_out
        return x + self.mlp(self.mlp_norm(x)), kv


class ToyDecoder(nn.Module):
    """The decoder. ``forward`` returns final-norm hidden states; ``project`` is the LM head.

    Keeping the head out of ``forward`` is the memory contract in miniature: callers gather
    the positions they need from ``[B, T, H]`` and project only those.
    """

    def __init__(self, cfg: ToyModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = Rotary(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.lm_head = (
            None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        )
        self._init_weights()
        if cfg.lora_enabled:
            for name, param in self.named_parameters():
                param.requires_grad_(".lora_" in name)

    def _init_weights(self) -> None:
        residual_std = 0.02 / math.sqrt(2 * self.config.num_layers)
        nn.init.normal_(self.embed.weight, std=0.02)
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, std=0.02)
        for name, module in self.named_modules():
            if isinstance(module, ToyLinear):
                is_residual = name.endswith(("o_proj", "down_proj"))
                nn.init.normal_(module.weight, std=residual_std if is_residual else 0.02)
                if module.rank > 0:
                    nn.init.kaiming_uniform_(module.lora_A, a=math.sqrt(5))
                    nn.init.zeros_(module.lora_B)

    @property
    def head_weight(self) -> torch.Tensor:
        """``[V, H]`` output matrix (the embedding when tied)."""
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        cache: KVCache | None = None,
        *,
        key_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KVCache]:
        """``input_ids: [B, t]`` after ``cache`` (length ``t_past``) -> ``([B, t, H], cache)``.

        Positions are ``t_past .. t_past + t - 1``; the returned cache covers all of them.
        A padded batch instead passes ``key_mask`` (``[B, t_past + t]``, 1 = real slot) and
        ``positions`` (``[B, t]``): a query sees the real slots up to its own, and always
        itself, so a pad query attends to something finite and never produces NaN.
        """
        allowed = None
        if key_mask is not None and input_ids.shape[1] == 1:
            allowed = key_mask.to(torch.bool, copy=True)
            allowed[:, -1] = True
            allowed = allowed[:, None, None, :]
        elif key_mask is not None:
            t = input_ids.shape[1]
            total = key_mask.shape[1]
            causal = torch.ones(t, total, dtype=torch.bool, device=input_ids.device).tril(
                diagonal=total - t
            )
            self_slot = torch.zeros_like(causal)
            self_slot[:, total - t :] = torch.eye(t, dtype=torch.bool, device=input_ids.device)
            allowed = ((key_mask.bool()[:, None, :] & causal) | self_slot).unsqueeze(1)
        x = self.embed(input_ids)
        t = input_ids.shape[1]
        offset = 0 if cache is None else cache.length
        rope = self.rotary.tables(offset, t, positions, x.dtype)
        buffers = None if cache is None else cache.writable(t)
        layers = []
        for i, layer in enumerate(self.layers):
            slots = None if buffers is None else _LayerSlots(buffers, i, offset)
            x, kv = layer(x, rope, slots, allowed)
            layers.append(kv)
        if buffers is None:
            return self.norm(x), KVCache.of(layers)
        buffers.length = offset + t
        return self.norm(x), KVCache(buffers, offset + t)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., H] -> [..., V]`` logits."""
        return F.linear(hidden, self.head_weight)


# ------------------------------------------------------------------------------ the backend


def _select_cache(cache: KVCache, rows: torch.Tensor, slots: torch.Tensor) -> KVCache:
    """Batch rows ``rows`` and cache slots ``slots`` of every layer's ``[B, heads, S, d]``."""
    return KVCache.of(
        [
            (
                k.index_select(0, rows).index_select(2, slots),
                v.index_select(0, rows).index_select(2, slots),
            )
            for k, v in cache
        ]
    )


class ToyBackend:
    """``CausalLMBackend`` over a :class:`ToyDecoder` and a tokenizer (usually :class:`ToyTokenizer`).

    Initialisation is seeded without touching the global RNG, so the same ``seed`` builds
    the same weights in every process.
    """

    supports_prefix_cache = True
    """``generate_batch`` takes ``prefix_cache=`` (incremental prefill across turns)."""

    def __init__(
        self,
        config: ToyModelConfig,
        tokenizer: TokenizerLike,
        *,
        model_id: str,
        device: str = "cpu",
        seed: int = 0,
        revision: str | None = None,
    ) -> None:
        if tokenizer.vocab_size > config.vocab_size:
            raise BackendError(
                f"toy model vocab_size {config.vocab_size} is smaller than the tokenizer's "
                f"{tokenizer.vocab_size}",
                hint="build the ToyModelConfig with vocab_size=tokenizer.vocab_size",
            )
        self.config = config
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.revision = revision
        self.seed = seed
        self._device = _resolve_device(device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = ToyDecoder(config)
        module.eval()
        self._module: ToyDecoder | None = module.to(self._device)
        self._parameters: list[nn.Parameter] | None = None
        self._module_list: list[nn.Module] | None = None

    # -- state ------------------------------------------------------------------------------

    @property
    def module(self) -> ToyDecoder:
        """The live decoder; raises after :meth:`release`."""
        if self._module is None:
            raise BackendError(
                f"toy backend {self.model_id!r} was released",
                hint="build a new backend (or reload its state) before using it again",
            )
        return self._module

    @property
    def device(self) -> str:
        return self._device

    @property
    def capabilities(self) -> BackendCapabilities:
        module = self.module
        return BackendCapabilities(
            backend="toy",
            model_id=self.model_id,
            revision=self.revision,
            vocab_size=self.config.vocab_size,
            hidden_size=self.config.hidden_size,
            num_layers=self.config.num_layers,
            num_parameters=sum(p.numel() for p in module.parameters()),
            num_trainable_parameters=sum(p.numel() for p in module.parameters() if p.requires_grad),
            precision="float32",
            quantization="none",
            lora=self.config.lora_enabled,
            kv_cache=True,
            can_offload=True,
            device=self._device,
            extra={"config": dataclasses.asdict(self.config), "seed": self.seed},
        )

    def set_train(self, mode: bool) -> None:
        """Train or eval mode for the whole decoder; a no-op when it is already there
        (mode changes only ever go through the root, see ``sampling.eval_mode``).

        What ``module.train(mode)`` does, over a list of the decoder's modules kept from
        the first call: no toy module overrides ``train``, and the recursive walk cost
        ~0.2 ms, paid twice in every update.
        """
        module = self.module
        if module.training == mode:
            return
        if self._module_list is None:
            self._module_list = list(module.modules())
        for m in self._module_list:
            m.training = mode

    def to_device(self, device: str) -> None:
        self._device = _resolve_device(device)
        self.module.to(self._device)
        self._parameters = None

    def release(self) -> None:
        """Drop the decoder so its memory can be reclaimed; the backend is unusable afterwards."""
        self._module = None
        self._parameters = self._module_list = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- generation and scoring -------------------------------------------------------------

    def generate(
        self,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_sequences: tuple[str, ...] = (),
    ) -> GenerationResult:
        module = self.module
        with eval_mode(module), torch.inference_mode():
            return run_generation(
                self._step,
                prompt_ids,
                tokenizer=self.tokenizer,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=seed,
                stop_sequences=stop_sequences,
                eos_token_id=self.tokenizer.eos_token_id,
                device=self._device,
            )

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: Sequence[int],
        seeds: Sequence[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_sequences: tuple[str, ...] = (),
        prefix_cache: PrefixCache | None = None,
    ) -> list[GenerationResult]:
        """Row ``r`` is ``generate(prompts[r], max_new_tokens=max_new_tokens[r], seed=seeds[r])``.

        ``prefix_cache`` keeps the KV cache across calls so that a prompt extending an
        earlier call's ids prefills only its new ids (see :class:`PrefixCache`).
        """
        module = self.module
        with eval_mode(module), torch.inference_mode():
            return run_batched_generation(
                self._batch_step,
                prompts,
                tokenizer=self.tokenizer,
                max_new_tokens=max_new_tokens,
                seeds=seeds,
                temperature=temperature,
                top_p=top_p,
                stop_sequences=stop_sequences,
                eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id,
                device=self._device,
                prefix_cache=prefix_cache,
                select_cache=_select_cache,
            )

    def _batch_step(
        self,
        input_ids: torch.Tensor,
        key_mask: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache | None,
    ) -> tuple[torch.Tensor, KVCache]:
        hidden, cache = self.module(input_ids, cache, key_mask=key_mask, positions=positions)
        return self.module.project(hidden[:, -1]), cache

    def _step(self, input_ids: torch.Tensor, cache: KVCache | None) -> tuple[torch.Tensor, KVCache]:
        """New positions against the cache; only the last one is projected (``[1, V]``)."""
        hidden, cache = self.module(input_ids, cache)
        return self.module.project(hidden[:, -1]), cache

    def hidden_states_at(
        self, token_ids: list[int], positions: list[int], *, with_grad: bool = False
    ) -> torch.Tensor:
        """Final-norm hidden states ``[len(positions), H]`` of one sequence."""
        if not token_ids:
            raise BackendError("hidden_states_at needs a non-empty token sequence")
        module = self.module
        index = position_tensor(positions, len(token_ids), self._device)
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self._device)
        with torch.set_grad_enabled(with_grad):
            hidden, _ = module(ids)
            return hidden[0].index_select(0, index)

    def hidden_states_at_batch(
        self, batch: PaddedTrajectoryBatch, *, with_grad: bool = False
    ) -> torch.Tensor:
        """Final-norm hidden states ``[batch.num_positions, H]`` of a right-padded batch.

        Right padding plus causal attention means pads never influence a real position, so
        the attention mask needs no further use once its shape is checked.
        """
        check_right_padded(batch.attention_mask)
        module = self.module
        ids = batch.input_ids.to(self._device)
        flat_index = batch.flat_index.to(self._device)
        with torch.set_grad_enabled(with_grad):
            hidden, _ = module(ids)
            return gather_positions(hidden, flat_index)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head: ``[N, H] -> [N, V]`` logits."""
        return self.module.project(hidden)

    # -- parameters -------------------------------------------------------------------------

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters with ``requires_grad``, in ``module.parameters()`` order.

        The decoder's parameter objects never change after construction (a load copies
        into them), so the walk over its modules runs once;
        ``to_device`` and ``release`` drop it. The walk was ~0.2 ms a call, paid at every
        commit and fingerprint.
        """
        if self._parameters is None:
            self._parameters = list(self.module.parameters())
        return [p for p in self._parameters if p.requires_grad]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """LoRA factors when adapters are on, every parameter otherwise (CPU copies)."""
        return trainable_state(self.module)

    def load_trainable_state_dict(
        self, state: Mapping[str, torch.Tensor], *, strict: bool = True
    ) -> None:
        load_trainable_state(
            self.module, state, strict=strict, what=f"trainable state of {self.model_id!r}"
        )

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter as a detached, contiguous CPU tensor (safetensors-ready: no shared storage)."""
        return {
            name: p.detach().to("cpu", copy=True).contiguous()
            for name, p in self.module.named_parameters()
        }

    def load_full_state_dict(
        self, state: Mapping[str, torch.Tensor], *, strict: bool = True
    ) -> None:
        targets = dict(self.module.named_parameters())
        load_parameters(targets, state, strict=strict, what=f"full state of {self.model_id!r}")

    def __repr__(self) -> str:
        released = " released" if self._module is None else ""
        return f"ToyBackend({self.model_id!r}, device={self._device!r}{released})"


def _resolve_device(device: str) -> str:
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise BackendError(
            f"device {device!r} requested but CUDA is not available",
            hint="set models.device: cpu (or auto)",
        )
    return str(resolved)


__all__ = ["KVCache", "ToyBackend", "ToyDecoder", "ToyLinear"]
