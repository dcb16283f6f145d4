"""The shape of a toy decoder and the two presets, ``toy-student`` and ``toy-teacher``.

Plain validated data (no torch), kept apart so ``models/toy.py`` holds only the decoder and
its backend.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from miniverl.errors import ConfigError
from miniverl.models.tokenizers import TOY_VOCAB_SIZE


@dataclass(frozen=True)
class ToyModelConfig:
    """Shape of a :class:`ToyDecoder`. ``lora_rank == 0`` means no adapters."""

    vocab_size: int = TOY_VOCAB_SIZE
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 128
    max_seq_len: int = 1024
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        problems = []
        if self.hidden_size % self.num_heads:
            problems.append(
                f"num_heads={self.num_heads} must divide hidden_size={self.hidden_size}"
            )
        elif (self.hidden_size // self.num_heads) % 2:
            problems.append("head_dim = hidden_size / num_heads must be even for rotary embeddings")
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "max_seq_len",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if self.lora_rank < 0:
            problems.append("lora_rank must be >= 0")
        if not 0 <= self.lora_dropout < 1:
            problems.append("lora_dropout must be in [0, 1)")
        if problems:
            raise ConfigError("invalid toy model config: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def lora_enabled(self) -> bool:
        return self.lora_rank > 0

    def with_lora(self, rank: int, alpha: float = 16.0, dropout: float = 0.0) -> ToyModelConfig:
        """This shape with adapters of the given rank (``rank=0`` removes them)."""
        return dataclasses.replace(self, lora_rank=rank, lora_alpha=alpha, lora_dropout=dropout)


TOY_STUDENT = ToyModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)
"""About 103k parameters, tied head."""

TOY_TEACHER = ToyModelConfig(
    hidden_size=128, num_layers=3, num_heads=4, intermediate_size=256, tie_embeddings=False
)
"""About 0.58M parameters, untied head: clearly larger than the student."""

TOY_PRESETS: dict[str, ToyModelConfig] = {"toy-student": TOY_STUDENT, "toy-teacher": TOY_TEACHER}


def toy_preset(model_id: str) -> ToyModelConfig:
    """The preset named ``toy-student`` or ``toy-teacher``."""
    try:
        return TOY_PRESETS[model_id]
    except KeyError:
        raise ConfigError(
            f"{model_id!r} is not a toy preset ({', '.join(TOY_PRESETS)})",
            hint="name one of these presets in models.student.model_id / models.teacher.model_id",
        ) from None


__all__ = ["TOY_PRESETS", "TOY_STUDENT", "TOY_TEACHER", "ToyModelConfig", "toy_preset"]
