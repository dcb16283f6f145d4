"""The Hugging Face backend: a ``transformers`` causal LM behind ``CausalLMBackend``.

What it does differently from calling ``model(input_ids).logits``, and why:

- Scoring never materialises ``[B, T, V]`` logits. :meth:`HFBackend._backbone_forward`
  calls the decoder backbone (``model.get_decoder()``) for final-norm hidden states
  ``[B, T, H]``, positions are gathered with ``index_select`` and only ``[N, H]`` reaches the
  LM head (``get_output_embeddings()``). With a 150k vocabulary that is the difference
  between megabytes and gigabytes.
- Generation uses the shared loop (``models/sampling.py``) with the model's own KV cache
  objects and projects only the last position per step.
- LoRA goes through ``peft``; only adapter parameters are trainable and checkpointed.
- NF4 / int8 weights go through ``bitsandbytes`` and exist only on CUDA.
- Remote code is never executed: ``trust_remote_code`` is always ``False``, because a
  recipe naming a hub id must not be able to run arbitrary Python.

One base model serving the actor and a frozen teacher (``models.runtime: shared_backbone``)
is ``models/hf_shared.py``, which builds on this module (this one never imports it).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import inspect
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from miniverl.errors import BackendError, ConfigError
from miniverl.models.base import BackendCapabilities, GenerationResult, PaddedTrajectoryBatch
from miniverl.models.sampling import (
    PrefixCache,
    check_right_padded,
    eval_mode,
    gather_positions,
    load_trainable_state,
    position_tensor,
    run_batched_generation,
    run_generation,
    trainable_state,
)
from miniverl.models.tokenizers import cached_snapshot, load_hf_tokenizer, load_pretrained
from miniverl.utils.lazy import require

if TYPE_CHECKING:
    from miniverl.config.sections import ModelSpec
    from miniverl.schemas.text import TokenizerLike

DEFAULT_LORA_TARGETS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
"""Attention and MLP projections of Llama, Qwen2/2.5/3 and Mistral style decoders."""

PRECISIONS: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
QUANTIZATIONS: tuple[str, ...] = ("none", "nf4", "int8")
TEACHER_ADAPTER = "teacher"
"""Name of the fitted teacher's adapter on a shared backbone."""

THIRD_PARTY_NOISE: tuple[tuple[str, type[Warning], str], ...] = (
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning, r"transformers\."),
)
"""``(message regex, category, module regex)`` of warnings that libraries raise at each other
and that no miniverl setting can act on: peft's ``PeftModel`` reads the property transformers
5 deprecated, so every LoRA attach printed a FutureWarning in every HF run. Silenced only
around the calls that trigger them (:func:`quiet_third_party_noise`), never process-wide."""


@contextlib.contextmanager
def quiet_third_party_noise() -> Iterator[None]:
    """Ignore exactly the :data:`THIRD_PARTY_NOISE` warnings inside the block."""
    with warnings.catch_warnings():
        for message, category, module in THIRD_PARTY_NOISE:
            warnings.filterwarnings("ignore", message=message, category=category, module=module)
        yield


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """Adapter settings, as in a recipe's ``models.<role>.lora`` block."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None

    @classmethod
    def from_mapping(cls, lora: Mapping[str, Any] | Any | None) -> LoraSettings | None:
        """``None`` or ``enabled: false`` -> no adapters; unknown keys are an error."""
        if lora is None:
            return None
        data = dict(lora.model_dump() if hasattr(lora, "model_dump") else lora)
        if not data.pop("enabled", True):
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown LoRA setting(s) {unknown}",
                hint=f"allowed keys: enabled, {', '.join(sorted(known))}",
            )
        targets = data.get("target_modules")
        if targets is not None:
            data["target_modules"] = tuple(targets)
        return cls(**data)


class HFBackend:
    """``CausalLMBackend`` over ``AutoModelForCausalLM`` and a matching tokenizer.

    ``model_id`` is a local directory (anything ``save_pretrained`` wrote) or a hub id, which
    is resolved from the local cache first and from the network only when not offline.
    ``precision``: ``auto`` (bfloat16 on CUDA with bf16 support, else float32), ``float32``,
    ``bfloat16`` or ``float16``. ``quantization``: ``none``, ``nf4`` or ``int8`` (CUDA and
    bitsandbytes only). ``lora``: ``None`` or a mapping with ``enabled``, ``r``, ``alpha``,
    ``dropout``, ``target_modules``. ``adapter_name`` names the peft adapter (it appears in
    the trainable state's keys). ``activation_checkpointing``: training forwards keep only
    each decoder layer's input and recompute the layer in the backward
    (:func:`enable_activation_checkpointing`). ``trust_remote_code`` exists only to be refused.
    """

    supports_prefix_cache = True
    """``generate_batch`` takes ``prefix_cache=`` (incremental prefill across turns)."""

    def __init__(
        self,
        model_id: str | Path,
        *,
        revision: str | None = None,
        tokenizer: TokenizerLike | None = None,
        tokenizer_id: str | Path | None = None,
        precision: str = "auto",
        quantization: str = "none",
        lora: Mapping[str, Any] | Any | None = None,
        device: str = "cpu",
        trust_remote_code: bool = False,
        seed: int = 0,
        adapter_name: str = "default",
        activation_checkpointing: bool = False,
    ) -> None:
        if trust_remote_code:
            raise BackendError(
                "trust_remote_code is not supported",
                hint="miniverl only loads architectures built into transformers; it never executes checkpoint code",
            )
        transformers = require("transformers", "the hf backend")
        self.model_id = str(model_id)
        self.revision = revision
        self.seed = seed
        self.adapter_name = adapter_name
        self.quantization = _check_quantization(quantization, device)
        self._device = str(torch.device(device))
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise BackendError(
                f"device {device!r} requested but CUDA is not available",
                hint="set models.device: cpu (or auto)",
            )
        self.dtype = _resolve_precision(precision, self._device)
        self.precision = next(name for name, dt in PRECISIONS.items() if dt == self.dtype)
        self.lora = LoraSettings.from_mapping(lora)
        self.tokenizer: TokenizerLike = tokenizer or load_hf_tokenizer(
            tokenizer_id or model_id, revision=None if tokenizer_id else revision
        )

        # safetensors only: a pytorch_model.bin would be unpickled by torch.load
        kwargs: dict[str, Any] = {"dtype": self.dtype, "use_safetensors": True}
        if self.quantization != "none":
            kwargs["quantization_config"] = _bnb_config(transformers, self.quantization, self.dtype)
            kwargs["device_map"] = {"": self._device}
        model = load_pretrained(
            transformers.AutoModelForCausalLM,
            self.model_id,
            revision=revision,
            what="model",
            **kwargs,
        )
        if self.quantization == "none":
            model = model.to(self._device)
        model.eval()
        self._check_vocab(model)
        self._resolved_commit = self._commit_of(model)
        self._base = model
        self._model: Any = model
        if self.lora is not None:
            self._model = self._attach_lora(model, self.lora)
        self.activation_checkpointing = activation_checkpointing
        if activation_checkpointing:
            enable_activation_checkpointing(model)
        self._bind_backbone()
        self._rollout_copy: RolloutCopy | None = None

    @classmethod
    def from_spec(
        cls,
        spec: ModelSpec,
        *,
        tokenizer: TokenizerLike | None = None,
        device: str = "cpu",
        seed: int = 0,
        train_adapters: bool = True,
        adapter_name: str = "default",
        activation_checkpointing: bool = False,
    ) -> HFBackend:
        """Build from a recipe's ``models.student`` / ``models.teacher`` block.

        ``train_adapters=False`` ignores the LoRA block (the teacher is never trained);
        ``activation_checkpointing`` is ``memory.activation_checkpointing``.
        """
        return cls(
            spec.model_id,
            revision=spec.revision,
            tokenizer=tokenizer,
            tokenizer_id=spec.tokenizer_id,
            precision=spec.precision,
            quantization=spec.quantization,
            lora=spec.lora if train_adapters else None,
            device=device,
            seed=seed,
            adapter_name=adapter_name,
            activation_checkpointing=activation_checkpointing,
        )

    # -- loading helpers --------------------------------------------------------------------

    def _commit_of(self, model: Any) -> str | None:
        """The hub commit the weights came from (None for a plain local directory)."""
        commit = getattr(model.config, "_commit_hash", None)
        if commit is None and not Path(self.model_id).expanduser().is_dir():
            snapshot = cached_snapshot(self.model_id, self.revision)
            commit = snapshot.name if snapshot is not None else None
        return commit

    def _check_vocab(self, model: Any) -> None:
        rows = model.get_output_embeddings().weight.shape[0]
        if self.tokenizer.vocab_size > rows:
            raise BackendError(
                f"tokenizer has {self.tokenizer.vocab_size} tokens but {self.model_id!r} has only "
                f"{rows} output rows",
                hint="load the tokenizer that belongs to this checkpoint",
            )

    def _attach_lora(self, model: Any, settings: LoraSettings) -> Any:
        peft = require("peft", "LoRA adapters on the hf backend")
        targets = settings.target_modules or self._default_targets(model)
        config = peft.LoraConfig(
            r=settings.r,
            lora_alpha=settings.alpha,
            lora_dropout=settings.dropout,
            target_modules=list(targets),
            bias="none",
            task_type="CAUSAL_LM",
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            try:
                with quiet_third_party_noise():
                    return peft.get_peft_model(model, config, adapter_name=self.adapter_name)
            except ValueError as exc:
                raise BackendError(
                    f"could not attach LoRA to {self.model_id!r}: {exc}",
                    hint="set models.<role>.lora.target_modules to module names of this architecture",
                ) from exc

    def _default_targets(self, model: Any) -> tuple[str, ...]:
        leaf_names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        found = tuple(t for t in DEFAULT_LORA_TARGETS if t in leaf_names)
        if not found:
            raise BackendError(
                f"{self.model_id!r} has none of the default LoRA targets {list(DEFAULT_LORA_TARGETS)}",
                hint="set models.<role>.lora.target_modules explicitly",
            )
        return found

    def add_frozen_adapter(self, name: str, settings: LoraSettings) -> None:
        """A second LoRA adapter ``name`` on the same base, inactive and frozen.

        Used by ``shared_backbone`` for a fitted teacher: the actor's adapter stays the
        active one, and the new adapter's parameters never require grad (so they never
        enter the optimizer or the actor's checkpoints).
        """
        if self.lora is None:
            raise BackendError(
                f"adapter {name!r} needs the actor to have LoRA adapters",
                hint="set models.student.lora.enabled: true",
            )
        peft = require("peft", "LoRA adapters on the hf backend")
        config = peft.LoraConfig(
            r=settings.r,
            lora_alpha=settings.alpha,
            lora_dropout=settings.dropout,
            target_modules=list(settings.target_modules or self._default_targets(self._base)),
            bias="none",
            task_type="CAUSAL_LM",
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + 1)
            with quiet_third_party_noise():
                self.model.add_adapter(name, config)
        self.model.set_adapter(self.adapter_name)
        for param_name, param in self.model.named_parameters():
            if f".{name}." in param_name:
                param.requires_grad_(False)

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """CPU copies of adapter ``name``'s tensors (keys as in ``named_parameters``)."""
        return {
            k: p.detach().to("cpu", copy=True)
            for k, p in self.model.named_parameters()
            if f".{name}." in k
        }

    def _bind_backbone(self) -> None:
        self._backbone = self._base.get_decoder()
        self._lm_head = self._base.get_output_embeddings()
        params = inspect.signature(self._backbone.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    # -- state ------------------------------------------------------------------------------

    @property
    def model(self) -> Any:
        """The live model (a ``peft`` wrapper when LoRA is on); raises after :meth:`release`."""
        self._require_live()
        return self._model

    def _require_live(self) -> None:
        if self._model is None:
            raise BackendError(
                f"hf backend {self.model_id!r} was released",
                hint="build a new backend before using it again",
            )

    @property
    def device(self) -> str:
        return self._device

    @property
    def capabilities(self) -> BackendCapabilities:
        model = self.model
        config = self._base.config
        params = list(model.parameters())
        return BackendCapabilities(
            backend="hf",
            model_id=self.model_id,
            revision=self.revision,
            vocab_size=int(self._lm_head.weight.shape[0]),
            hidden_size=int(config.hidden_size),
            num_layers=int(config.num_hidden_layers),
            num_parameters=sum(p.numel() for p in params),
            num_trainable_parameters=sum(p.numel() for p in params if p.requires_grad),
            precision=self.precision,
            quantization=self.quantization,
            lora=self.lora is not None,
            kv_cache=True,
            can_offload=self.quantization == "none",
            device=self._device,
            extra={
                "architecture": str(config.model_type),
                "resolved_commit": self._resolved_commit,
                "tokenizer_vocab_size": self.tokenizer.vocab_size,
                "trust_remote_code": False,
                "lora": dataclasses.asdict(self.lora) if self.lora is not None else None,
                "num_parameters_note": "stored elements; 4-bit weights pack two values per element",
            },
        )

    def set_train(self, mode: bool) -> None:
        self.model.train(mode)

    def set_rollout_dtype(self, dtype: str) -> None:
        """``"bfloat16"``: ``generate`` / ``generate_batch`` decode from a bf16 copy of the
        model (:class:`RolloutCopy`); ``"model"``: from the model itself. Scoring, training and
        ``hidden_states_at*`` always use the model's own weights."""
        if dtype not in ("model", "bfloat16"):
            raise BackendError(f"unknown rollout dtype {dtype!r}", hint="use 'model' or 'bfloat16'")
        wanted = None if dtype == "model" or self.dtype == torch.bfloat16 else torch.bfloat16
        if wanted is None:
            self._rollout_copy = None
        elif self._rollout_copy is None:
            self._rollout_copy = RolloutCopy(wanted)

    @contextlib.contextmanager
    def _rollout_weights(self) -> Iterator[None]:
        """Decode through the rollout copy's backbone and head while the block runs."""
        if self._rollout_copy is None:
            yield
            return
        own = self._backbone, self._lm_head
        self._backbone, self._lm_head = self._rollout_copy.bound(self._base)
        try:
            yield
        finally:
            self._backbone, self._lm_head = own

    def to_device(self, device: str) -> None:
        target = str(torch.device(device))
        if target == self._device:
            return
        if self.quantization != "none":
            raise BackendError(
                f"a {self.quantization}-quantized model cannot move from {self._device} to {target}",
                hint="bitsandbytes weights are pinned to the device they were quantized on; use memory.strategy: resident",
            )
        if torch.device(target).type == "cuda" and not torch.cuda.is_available():
            raise BackendError(f"device {device!r} requested but CUDA is not available")
        self.model.to(target)
        self._device = target

    def release(self) -> None:
        """Drop every reference to the model and return its memory to the allocator."""
        self._model = None
        self._base = None
        self._rollout_copy = None
        self._backbone = None
        self._lm_head = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- forward paths ----------------------------------------------------------------------

    def _backbone_forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        past_key_values: Any = None,
        use_cache: bool = False,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """Decoder backbone only: ``[B, T]`` ids -> final-norm hidden ``[B, T, H]`` and the cache.

        The LM head is not applied, so no ``[B, T, V]`` tensor exists.
        """
        self._require_live()
        out = self._backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=use_cache,
            **({} if position_ids is None else {"position_ids": position_ids}),
            **{self._cache_kwarg: past_key_values},
        )
        cache = getattr(out, self._cache_kwarg) if use_cache else None
        return out.last_hidden_state, cache

    def _step(self, input_ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        hidden, cache = self._backbone_forward(
            input_ids, None, past_key_values=cache, use_cache=True
        )
        return self._lm_head(hidden[:, -1]).float(), cache

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
        with eval_mode(self.model), self._rollout_weights():
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
        """Left-padded batched decoding; row ``r`` equals ``generate`` of ``prompts[r]``.

        The 2-D ``attention_mask`` marks real cache slots and ``position_ids`` count real
        tokens only, which is what Llama/Qwen-style rotary models need under left padding
        (the same convention as ``model.generate()``). With ``prefix_cache`` the model's
        ``DynamicCache`` is kept across calls and a prompt that extends an earlier call's
        ids prefills only its new ids (see :class:`~miniverl.models.sampling.PrefixCache`).
        """
        with eval_mode(self.model), self._rollout_weights():
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
                select_cache=_select_dynamic_cache,
            )

    def _batch_step(
        self, input_ids: torch.Tensor, key_mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, Any]:
        hidden, cache = self._backbone_forward(
            input_ids, key_mask, past_key_values=cache, use_cache=True, position_ids=positions
        )
        return self._lm_head(hidden[:, -1]).float(), cache

    def hidden_states_at(
        self, token_ids: Sequence[int], positions: Sequence[int], *, with_grad: bool = False
    ) -> torch.Tensor:
        """Final-norm hidden states ``[len(positions), H]`` of one sequence."""
        if len(token_ids) == 0:
            raise BackendError("hidden_states_at needs a non-empty token sequence")
        index = position_tensor(positions, len(token_ids), self._device)
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self._device)
        with torch.set_grad_enabled(with_grad):
            hidden, _ = self._backbone_forward(ids, None)
            return hidden[0].index_select(0, index)

    def hidden_states_at_batch(
        self, batch: PaddedTrajectoryBatch, *, with_grad: bool = False
    ) -> torch.Tensor:
        """Final-norm hidden states ``[batch.num_positions, H]`` of a right-padded batch."""
        check_right_padded(batch.attention_mask)
        ids = batch.input_ids.to(self._device)
        mask = batch.attention_mask.to(self._device)
        flat_index = batch.flat_index.to(self._device)
        with torch.set_grad_enabled(with_grad):
            hidden, _ = self._backbone_forward(ids, mask)
            return gather_positions(hidden, flat_index)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head: ``[N, H] -> [N, V]`` logits in the model dtype (``V`` = output rows)."""
        self._require_live()
        return self._lm_head(hidden)

    # -- parameters -------------------------------------------------------------------------

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Adapter tensors only when LoRA is on, every parameter otherwise (CPU copies)."""
        return trainable_state(self.model)

    def load_trainable_state_dict(
        self, state: Mapping[str, torch.Tensor], *, strict: bool = True
    ) -> None:
        load_trainable_state(
            self.model, state, strict=strict, what=f"trainable state of {self.model_id!r}"
        )

    def __repr__(self) -> str:
        released = " released" if self._model is None else ""
        return f"HFBackend({self.model_id!r}, device={self._device!r}, precision={self.precision}{released})"


class RolloutCopy:
    """A copy of a model in a narrower dtype to decode from, kept in step with the model.

    Rollouts on a CPU stream every weight once per decoded token; bf16 halves those bytes
    where the CPU's bf16 matmuls are fast enough to profit (``models/probe.py`` measures it).
    The copy is made on first use and refreshed before a decode whenever a trainable
    parameter changed (an optimizer step or a state load bumps the tensor's version
    counter), so it always holds the current policy rounded to ``dtype``. Frozen weights
    are copied once.
    """

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._copy: Any = None
        self._key: tuple[Any, ...] | None = None

    def bound(self, base: Any) -> tuple[Any, Any]:
        """``(decoder, lm_head)`` of the copy of ``base``, refreshed if ``base`` trained since."""
        trainable = [(n, p) for n, p in base.named_parameters() if p.requires_grad]
        key = tuple((n, p.data_ptr(), p._version) for n, p in trainable)
        names = tuple(n for n, _ in base.named_parameters())
        if self._copy is None or names != tuple(n for n, _ in self._copy.named_parameters()):
            self._copy = copy.deepcopy(base).to(self.dtype).eval().requires_grad_(False)
        elif key != self._key:
            params = dict(self._copy.named_parameters())
            with torch.no_grad():
                for name, param in trainable:
                    params[name].copy_(param)
        self._key = key
        return self._copy.get_decoder(), self._copy.get_output_embeddings()


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute each decoder layer in the backward instead of keeping its activations.

    A training forward of SmolLM2-135M in float32 keeps about 1.2 MB per token for the
    backward (the MLP's four ``[T, 1536]`` tensors and the attention inputs of 30 layers);
    with this it keeps each layer's ``[T, 576]`` input (69 kB per token over 30 layers) plus
    one layer's activations while that layer's backward runs, for one more forward per
    update. Non-reentrant ``torch.utils.checkpoint`` replays the same kernels on the same
    inputs (and restores the RNG state for dropout), so losses and gradients are
    bit-identical. Only layers in training mode with gradients enabled are affected: decode,
    scoring and evaluation run as before. transformers also hooks the input embeddings to
    require gradients, which only the reentrant variant needs; that hook is removed so the
    backward computes nothing it did not compute before.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise BackendError(
            f"{type(model).__name__} does not support activation checkpointing",
            hint="set memory.activation_checkpointing: false for this architecture",
        )
    kwargs = {"use_reentrant": False}
    with quiet_third_party_noise():
        enable = getattr(model, "activation_checkpointing_enable", None)
        if callable(enable):
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if getattr(model, "_require_grads_hook", None) is not None:
        model.disable_input_require_grads()


def _select_dynamic_cache(cache: Any, rows: torch.Tensor, slots: torch.Tensor) -> Any:
    """Rows ``rows`` and slots ``slots`` of a ``DynamicCache`` (in place), or None.

    Only plain full-attention layers (keys/values ``[B, heads, S, d]``) can be sliced this
    way; a sliding-window or other cache layer returns None (the prompt is prefilled whole).
    """
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
        return None
    for layer in layers:
        if getattr(layer, "keys", None) is None:
            return None
        layer.keys = layer.keys.index_select(0, rows).index_select(2, slots)
        layer.values = layer.values.index_select(0, rows).index_select(2, slots)
    return cache


def _resolve_precision(precision: str, device: str) -> torch.dtype:
    if precision == "auto":
        on_cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
        return torch.bfloat16 if on_cuda and torch.cuda.is_bf16_supported() else torch.float32
    if precision not in PRECISIONS:
        raise ConfigError(
            f"unknown precision {precision!r}", hint=f"use auto or one of {', '.join(PRECISIONS)}"
        )
    return PRECISIONS[precision]


def _check_quantization(quantization: str, device: str) -> str:
    if quantization not in QUANTIZATIONS:
        raise ConfigError(
            f"unknown quantization {quantization!r}", hint=f"use one of {', '.join(QUANTIZATIONS)}"
        )
    if quantization == "none":
        return quantization
    if not torch.cuda.is_available() or torch.device(device).type != "cuda":
        raise BackendError(
            f"quantization {quantization!r} needs a CUDA device (device={device!r}, "
            f"cuda available: {torch.cuda.is_available()})",
            hint="set quantization: none on CPU, or run on a machine with an NVIDIA GPU",
        )
    require("bitsandbytes", f"{quantization} quantization")
    return quantization


def _bnb_config(transformers: Any, quantization: str, compute_dtype: torch.dtype) -> Any:
    if quantization == "nf4":
        return transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
        )
    return transformers.BitsAndBytesConfig(load_in_8bit=True)


__all__ = [
    "DEFAULT_LORA_TARGETS",
    "PRECISIONS",
    "QUANTIZATIONS",
    "TEACHER_ADAPTER",
    "HFBackend",
    "LoraSettings",
    "enable_activation_checkpointing",
]
