"""Typed errors for miniverl.

Every failure a user can cause (a bad recipe, a tampered file, a stale cache, a
missing checkpoint) raises a subclass of :class:`MiniverlError`. Each carries a
``hint``: the next thing to try. The CLI prints ``message`` and ``hint`` and exits
non-zero; it never shows a traceback for these.

This module imports nothing from miniverl and nothing outside the standard library,
so every layer may use it.
"""

from __future__ import annotations


class MiniverlError(Exception):
    """Root of every error miniverl raises on purpose.

    ``str(error)`` is the message alone, so tests can compare it exactly; the hint is
    kept separately and shown by :meth:`describe` and the CLI.
    """

    default_hint: str = "see the README for the expected inputs"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def describe(self) -> str:
        """Message plus hint, as the CLI prints it."""
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class ConfigError(MiniverlError):
    """A recipe, an override or a combination of settings is invalid."""

    default_hint = "run 'miniverl validate <recipe.yaml>' to see every problem with its key path"


class SchemaValidationError(MiniverlError):
    """A serialized record (trajectory line, index file) does not match its schema."""

    default_hint = "the file was edited, truncated or written by another version; regenerate it"


class TrajectoryError(MiniverlError):
    """A trajectory-level rule was broken (e.g. a context token used as a target)."""

    default_hint = "only model-generated tokens at index > 0 may be training targets"


class AlignmentError(MiniverlError):
    """Student and teacher positions could not be aligned exactly."""

    default_hint = "the teacher render must contain every student segment with identical token ids"


class TokenizerMismatchError(MiniverlError):
    """Student and teacher tokenize differently; same-tokenizer distillation only."""

    default_hint = "choose a teacher from the same model family (identical tokenizer)"


class StaleCacheError(MiniverlError):
    """A cached teacher target was produced under a different policy version."""

    default_hint = (
        "on-policy distillation must score fresh rollouts; delete the cache or, for offline_kd "
        "only, set cache.reuse_across_policy_versions: true"
    )


class OffPolicyError(StaleCacheError):
    """Strict OPD: a rollout was not sampled by the weights the update is about to change.

    Raised when the policy fingerprint recorded with a rollout (or with its teacher
    targets) differs from the fingerprint of the student's current trainable weights.
    A subclass of :class:`StaleCacheError`, so callers that handle stale targets handle it.
    """

    default_hint = (
        "strict on-policy distillation updates only the weights that sampled the rollout; "
        "roll out with the current student (or use train.opd_freshness: replay, labelled as such)"
    )


class CacheIntegrityError(MiniverlError):
    """A teacher-cache file is corrupt, truncated, tampered with or malformed."""

    default_hint = "run 'miniverl cache validate <dir>'; delete the cache directory to rebuild it"


class CheckpointError(MiniverlError):
    """A checkpoint is missing, incomplete, tampered with or belongs to another config."""

    default_hint = (
        "resume only from a checkpoint with a valid checkpoint.json written by the same recipe"
    )


class GpuMemoryError(MiniverlError):
    """Out of memory (GPU, or CPU under a memory cap) after every permitted retry or split."""

    default_hint = "lower loss.chunk_size, train.trajectory_batch_size or rollout.max_total_tokens"


class ToolEnvironmentError(MiniverlError):
    """A tool environment was misused (unknown environment, bad task, bad parameters).

    Named ``ToolEnvironmentError`` so it does not shadow the builtin ``EnvironmentError``.
    Errors *inside* a tool call are not exceptions: they are returned to the model as an
    error result it can read.
    """

    default_hint = "run 'miniverl doctor' to list the registered environments"


class TeacherGateError(MiniverlError):
    """The teacher is not competent enough at the student's states to start a benchmark."""

    default_hint = "fit the teacher longer or on more noise-injected traces (lab.toy_fit)"


class ProtocolError(MiniverlError):
    """A test-split benchmark has no frozen protocol file, or the file changed after freezing."""

    default_hint = (
        "write the protocol (endpoints, thresholds, seeds, arms, lr grid, primary contrasts) "
        "before touching the test split and pass it with --protocol FILE (docs/benchmark.md)"
    )


class BackendError(MiniverlError):
    """A model backend could not be built or used as asked (missing extra, no CUDA, ...)."""

    default_hint = "run 'miniverl doctor': it lists the installed packages and devices"


class ModelSourceError(MiniverlError):
    """A pretrained model could not be obtained, verified or converted (``miniverl models``)."""

    default_hint = "run 'miniverl models fetch --help' for the supported models and options"


class RunDirectoryError(MiniverlError):
    """A run directory is missing an artifact or cannot be written safely."""

    default_hint = "point the command at a directory written by 'miniverl train' or 'miniverl demo'"


class RunStorageError(MiniverlError):
    """The disk filled up (``ENOSPC``) while writing a run artifact.

    Nothing partial is left looking valid (temporary files are removed, a cut-off log
    line is truncated away), so the run resumes once space is freed.
    """

    default_hint = (
        "free disk space, then continue with: miniverl train <recipe> --output <run> --resume"
    )


__all__ = [
    "AlignmentError",
    "BackendError",
    "CacheIntegrityError",
    "CheckpointError",
    "ConfigError",
    "GpuMemoryError",
    "MiniverlError",
    "ModelSourceError",
    "OffPolicyError",
    "ProtocolError",
    "RunDirectoryError",
    "RunStorageError",
    "SchemaValidationError",
    "StaleCacheError",
    "TokenizerMismatchError",
    "ToolEnvironmentError",
    "TrajectoryError",
]
