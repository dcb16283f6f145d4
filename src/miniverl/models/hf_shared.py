"""``models.runtime: shared_backbone``: one HF base model serving the actor and a frozen role.

The actor is an :class:`~miniverl.models.hf.HFBackend` with its LoRA adapter; the teacher
is an :class:`HFRoleView` of the same weights with adapters off, or with its own frozen
adapter, so distillation needs one copy of the model on the device. Kept apart from
``models/hf.py`` because it composes the backend rather than being part of it: the view
only switches adapters around the owner's calls. It imports ``models.hf``; ``models.hf``
never imports it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from miniverl.errors import BackendError, CheckpointError, ConfigError
from miniverl.models.base import BackendCapabilities, GenerationResult, PaddedTrajectoryBatch
from miniverl.models.hf import TEACHER_ADAPTER, HFBackend, LoraSettings
from miniverl.models.sampling import PrefixCache
from miniverl.utils.seeding import derive_seed

if TYPE_CHECKING:
    from miniverl.config.models import RunConfig
    from miniverl.config.sections import LoraConfig
    from miniverl.schemas.text import TokenizerLike


class HFRoleView:
    """A frozen role (teacher, reference) over a shared :class:`HFBackend`'s base weights.

    ``models.runtime: shared_backbone`` loads one base model. The actor is the owner with
    its LoRA adapter; this view runs the same weights with every adapter switched off
    (``adapter=None``) or with its own frozen adapter ``adapter`` active instead of the
    actor's, so the teacher costs no second copy of the model. Each backbone call enters
    ``peft``'s ``disable_adapter()`` (or ``set_adapter(adapter)``) and restores the
    actor's adapter and every ``requires_grad`` flag on exit, also on error, so a teacher
    call can neither leak its adapter choice into the actor nor change what the
    optimizer trains. The LM head carries no adapter, so :meth:`project`
    calls it directly (it may run inside the actor's backward). The view owns nothing:
    :meth:`release` drops the view only, and it cannot move to another device alone.

    A forward with gradients whose backward runs later (fitting the view's adapter) must run
    inside :meth:`held` when the owner recomputes layers in the backward
    (``memory.activation_checkpointing``): the recompute runs with whichever adapter is
    active at backward time, and after a per-call switch that is the actor's again.
    """

    supports_prefix_cache = True

    def __init__(self, owner: HFBackend, *, role: str, adapter: str | None = None) -> None:
        if owner.lora is None:
            raise BackendError(
                f"a {role} view of a shared backbone needs the actor to have LoRA adapters",
                hint="set models.student.lora.enabled: true for models.runtime: shared_backbone",
            )
        self._owner: HFBackend | None = owner
        self.role = role
        self.adapter = adapter
        self.tokenizer: TokenizerLike = owner.tokenizer
        self._held = 0

    @property
    def owner(self) -> HFBackend:
        if self._owner is None:
            raise BackendError(
                f"the {self.role} view of the shared backbone was released",
                hint="build the runtime again to get a new view",
            )
        return self._owner

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """This view's adapters for the whole block, every forward and backward inside it.

        The calls inside do not switch adapters back and forth; the actor's adapter and
        the ``requires_grad`` flags come back when the outermost block exits.
        """
        with self._adapters_off():
            self._held += 1
            try:
                yield
            finally:
                self._held -= 1

    def _check_recompute(self, with_grad: bool) -> None:
        """Refuse a forward whose recomputed backward would run under the actor's adapter."""
        if with_grad and self.owner.activation_checkpointing and not self._held:
            raise BackendError(
                f"a forward with gradients through the {self.role} view recomputes its layers "
                "in the backward, after the view has switched back to the actor's adapter",
                hint=f"run the forward and its backward inside 'with view.held():' (the {self.role} "
                "adapter fit does), or set memory.activation_checkpointing: false",
            )

    @contextlib.contextmanager
    def _adapters_off(self) -> Iterator[None]:
        if self._held:
            yield
            return
        model = self.owner.model
        flags = [(p, p.requires_grad) for p in model.parameters()]
        try:
            if self.adapter is None:
                with model.disable_adapter():
                    yield
            else:
                model.set_adapter(self.adapter)
                try:
                    yield
                finally:
                    model.set_adapter(self.owner.adapter_name)
        finally:
            for param, flag in flags:
                param.requires_grad_(flag)

    def unfrozen_adapter_parameters(self) -> list[torch.nn.Parameter]:
        """This view's adapter parameters (for fitting it); empty without an adapter."""
        if self.adapter is None:
            return []
        tag = f".{self.adapter}."
        return [p for n, p in self.owner.model.named_parameters() if tag in n]

    @property
    def device(self) -> str:
        return self.owner.device

    @property
    def capabilities(self) -> BackendCapabilities:
        caps = self.owner.capabilities
        extra = {
            **caps.extra,
            "runtime": "shared_backbone",
            "role": self.role,
            "adapters": "disabled" if self.adapter is None else f"{self.adapter} (frozen)",
        }
        return dataclasses.replace(caps, lora=False, num_trainable_parameters=0, extra=extra)

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
        with self._adapters_off():
            return self.owner.generate(
                prompt_ids,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=seed,
                stop_sequences=stop_sequences,
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
        with self._adapters_off():
            return self.owner.generate_batch(
                prompts,
                max_new_tokens=max_new_tokens,
                seeds=seeds,
                temperature=temperature,
                top_p=top_p,
                stop_sequences=stop_sequences,
                prefix_cache=prefix_cache,
            )

    def hidden_states_at(
        self, token_ids: Sequence[int], positions: Sequence[int], *, with_grad: bool = False
    ) -> torch.Tensor:
        """Base-model hidden states ``[len(positions), H]``."""
        self._check_recompute(with_grad)
        with self._adapters_off():
            return self.owner.hidden_states_at(token_ids, positions, with_grad=with_grad)

    def hidden_states_at_batch(
        self, batch: PaddedTrajectoryBatch, *, with_grad: bool = False
    ) -> torch.Tensor:
        """Base-model hidden states ``[batch.num_positions, H]``."""
        self._check_recompute(with_grad)
        with self._adapters_off():
            return self.owner.hidden_states_at_batch(batch, with_grad=with_grad)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """The shared LM head: ``[N, H] -> [N, V]``."""
        return self.owner.project(hidden)

    def set_train(self, mode: bool) -> None:
        """No-op: the shared module's train/eval mode belongs to the actor."""

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return []

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_trainable_state_dict(
        self, state: Mapping[str, torch.Tensor], *, strict: bool = True
    ) -> None:
        if state:
            raise CheckpointError(
                f"the {self.role} view of a shared backbone has no trainable state "
                f"(got {len(state)} tensors)",
                hint="load adapter checkpoints into the actor (student) backend",
            )

    def to_device(self, device: str) -> None:
        if str(torch.device(device)) != self.owner.device:
            raise BackendError(
                f"the {self.role} view shares the actor's weights and cannot move to {device} alone",
                hint="use memory.strategy: resident with models.runtime: shared_backbone",
            )

    def release(self) -> None:
        """Drop this view; the shared weights stay with the actor."""
        self._owner = None

    def __repr__(self) -> str:
        return f"HFRoleView(role={self.role!r}, owner={self._owner!r})"


def build_shared_backbone(
    config: RunConfig,
    tokenizer: TokenizerLike,
    device: str,
    *,
    teacher_adapter: LoraConfig | None = None,
) -> tuple[HFBackend, HFRoleView]:
    """One base model: the actor (student, adapter ``actor``) and a teacher view of it.

    Only the actor's adapter parameters are trainable. The teacher is the base model with
    adapters off, in the student's precision and quantization; with ``teacher_adapter`` it is
    the base plus a second, frozen adapter ``teacher`` of that shape, into which a teacher
    checkpoint is loaded (``training/teacher_checkpoint.py``) or the lab fits one.
    """
    student, teacher = config.models.student, config.models.teacher
    if student.model_id != teacher.model_id or student.revision != teacher.revision:
        raise ConfigError(
            "models.runtime: shared_backbone needs student and teacher to share one base "
            f"({student.model_id}@{student.revision} vs {teacher.model_id}@{teacher.revision})",
            hint="use models.runtime: dual_model for two different checkpoints",
        )
    actor = HFBackend.from_spec(
        student,
        tokenizer=tokenizer,
        device=device,
        seed=derive_seed(config.run.seed, "init", "student"),
        train_adapters=True,
        adapter_name="actor",
        activation_checkpointing=config.memory.activation_checkpointing,
    )
    if teacher_adapter is None:
        return actor, HFRoleView(actor, role="teacher")
    settings = LoraSettings.from_mapping(teacher_adapter) or LoraSettings()
    actor.add_frozen_adapter(TEACHER_ADAPTER, settings)
    return actor, HFRoleView(actor, role="teacher", adapter=TEACHER_ADAPTER)


__all__ = ["HFRoleView", "build_shared_backbone"]
