"""The objective layer: divergences, bucketed targets, reduction and the chunked loss.

Pure functions over tensors (docs/design.md §2.1): no model, no config object, no device
policy. The mathematics is specified in docs/objectives.md; this package imports nothing from
miniverl except :mod:`miniverl.errors`.
"""

from miniverl.losses.bucketed import (
    bucket_entropy,
    bucketed_divergence,
    teacher_entropy,
    teacher_topk_targets,
)
from miniverl.losses.chunked import ChunkedLossResult, chunked_selected_position_loss
from miniverl.losses.exact import (
    entropy_aware,
    exact_divergence,
    exact_divergence_from_log_probs,
    forward_kl,
    jsd,
    reverse_kl,
    sampled_token_nll,
)
from miniverl.losses.numerics import (
    DIVERGENCE_NAMES,
    DivergenceName,
    DivergenceOutput,
    DivergenceSpec,
)
from miniverl.losses.providers import (
    BucketedTargetProvider,
    ChunkTargetProvider,
    ConcatenatedTargetProvider,
    ExactTargetProvider,
    concat_providers,
)
from miniverl.losses.reduction import normalize_trajectory_weights

__all__ = [
    "DIVERGENCE_NAMES",
    "BucketedTargetProvider",
    "ChunkTargetProvider",
    "ChunkedLossResult",
    "ConcatenatedTargetProvider",
    "DivergenceName",
    "DivergenceOutput",
    "DivergenceSpec",
    "ExactTargetProvider",
    "bucket_entropy",
    "bucketed_divergence",
    "chunked_selected_position_loss",
    "concat_providers",
    "entropy_aware",
    "exact_divergence",
    "exact_divergence_from_log_probs",
    "forward_kl",
    "jsd",
    "normalize_trajectory_weights",
    "reverse_kl",
    "sampled_token_nll",
    "teacher_entropy",
    "teacher_topk_targets",
]
