"""Build the tokenizer, student and teacher a ``RunConfig`` describes.

Student and teacher must tokenize identically: ``build_tokenizer`` loads the teacher's
tokenizer whenever its source differs from the student's and compares behavioural
fingerprints, raising ``TokenizerMismatchError`` instead of guessing a mapping.
"""

from __future__ import annotations

import dataclasses

from miniverl.config.models import RunConfig
from miniverl.config.sections import ModelSpec, TeacherSpec
from miniverl.models.base import CausalLMBackend
from miniverl.models.tokenizers import ToyTokenizer, check_same_tokenizer, load_hf_tokenizer
from miniverl.schemas.text import TokenizerLike
from miniverl.utils.seeding import derive_seed


def _tokenizer_source(spec: ModelSpec | TeacherSpec) -> tuple[str, str | None]:
    tokenizer_id = getattr(spec, "tokenizer_id", None)
    if tokenizer_id:
        return tokenizer_id, None
    return spec.model_id, spec.revision


def build_tokenizer(config: RunConfig) -> TokenizerLike:
    """The shared tokenizer; refuses a teacher whose tokenizer behaves differently."""
    if config.models.backend == "toy":
        return ToyTokenizer()
    student_src = _tokenizer_source(config.models.student)
    tokenizer = load_hf_tokenizer(student_src[0], revision=student_src[1])
    teacher_src = _tokenizer_source(config.models.teacher)
    if teacher_src != student_src:
        check_same_tokenizer(tokenizer, load_hf_tokenizer(teacher_src[0], revision=teacher_src[1]))
    return tokenizer


def toy_config_for(spec: ModelSpec, tokenizer: TokenizerLike, *, trainable_lora: bool):
    """The ``ToyModelConfig`` of a recipe's model block: the preset ``model_id`` names."""
    from miniverl.models.toy_config import toy_preset

    base = dataclasses.replace(toy_preset(spec.model_id), vocab_size=tokenizer.vocab_size)
    if trainable_lora and spec.lora.enabled:
        return base.with_lora(spec.lora.r, spec.lora.alpha, spec.lora.dropout)
    return base.with_lora(0)


def teacher_model_spec(config: RunConfig) -> ModelSpec:
    """``models.teacher`` as a model block: a base model without adapters."""
    teacher = config.models.teacher
    return ModelSpec(
        model_id=teacher.model_id,
        revision=teacher.revision,
        precision=teacher.precision,
        quantization=teacher.quantization,
        lora={"enabled": False},
    )


def _build(
    config: RunConfig, role: str, tokenizer: TokenizerLike, device: str, spec: ModelSpec
) -> CausalLMBackend:
    seed = derive_seed(config.run.seed, "init", role)
    trainable = role == "student"
    if config.models.backend == "toy":
        from miniverl.models.toy import ToyBackend

        return ToyBackend(
            toy_config_for(spec, tokenizer, trainable_lora=trainable),
            tokenizer,
            model_id=spec.model_id,
            device=device,
            seed=seed,
            revision=spec.revision,
        )
    from miniverl.models.hf import TEACHER_ADAPTER, HFBackend

    checkpointed = role == "teacher" and spec.lora.enabled
    return HFBackend.from_spec(
        spec,
        tokenizer=tokenizer,
        device=device,
        seed=seed,
        train_adapters=trainable or checkpointed,
        adapter_name=TEACHER_ADAPTER if checkpointed else "default",
        activation_checkpointing=trainable and config.memory.activation_checkpointing,
    )


def build_student(config: RunConfig, tokenizer: TokenizerLike, device: str) -> CausalLMBackend:
    """The policy being trained (LoRA adapters when ``models.student.lora.enabled``).

    ``device`` is already resolved (:func:`miniverl.training.resolve.resolve_device`).
    """
    return _build(config, "student", tokenizer, device, config.models.student)


def build_teacher(
    config: RunConfig, tokenizer: TokenizerLike, device: str, spec: ModelSpec | None = None
) -> CausalLMBackend:
    """The frozen teacher, built on a resolved ``device``: the base model ``models.teacher``
    names, or ``spec`` (a teacher checkpoint's recorded student: its toy preset, or the
    frozen ``teacher`` adapter its LoRA tensors are loaded into)."""
    teacher = _build(config, "teacher", tokenizer, device, spec or teacher_model_spec(config))
    for p in teacher.trainable_parameters():
        p.requires_grad_(False)
    return teacher
