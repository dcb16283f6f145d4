"""The objective layer: divergences, bucketed targets, reduction and the chunked loss.

Pure functions over tensors (docs/design.md §2.1): no model, no config object, no device
policy. The mathematics is specified in docs/objectives.md and defined, one plain function
per divergence, in :mod:`miniverl.losses.divergences`; this package imports nothing from
miniverl except :mod:`miniverl.errors`.
"""

from miniverl.losses.bucketed import (
    bucket_entropy,
    bucket_log_probs,
    bucketed_divergence,
    teacher_entropy,
    teacher_topk_targets,
)
from miniverl.losses.chunked import ChunkedLossResult, chunked_selected_position_loss
from miniverl.losses.divergences import (
    DIVERGENCE_NAMES,
    DIVERGENCES,
    Divergence,
    DivergenceSpec,
    FusedDivergence,
    get_divergence,
)
from miniverl.losses.exact import (
    entropy_aware,
    exact_divergence,
    exact_divergence_from_log_probs,
    forward_kl,
    jsd,
    reverse_kl,
    sampled_token_nll,
)
from miniverl.losses.numerics import DivergenceOutput
from miniverl.losses.providers import (
    BucketedTargetProvider,
    ChunkTargetProvider,
    ConcatenatedTargetProvider,
    ExactTargetProvider,
    concat_providers,
)
from miniverl.losses.reduction import normalize_trajectory_weights

__all__ = [
    "DIVERGENCES",
    "DIVERGENCE_NAMES",
    "BucketedTargetProvider",
    "ChunkTargetProvider",
    "ChunkedLossResult",
    "ConcatenatedTargetProvider",
    "Divergence",
    "DivergenceOutput",
    "DivergenceSpec",
    "ExactTargetProvider",
    "FusedDivergence",
    "bucket_entropy",
    "bucket_log_probs",
    "bucketed_divergence",
    "chunked_selected_position_loss",
    "concat_providers",
    "entropy_aware",
    "exact_divergence",
    "exact_divergence_from_log_probs",
    "forward_kl",
    "get_divergence",
    "jsd",
    "normalize_trajectory_weights",
    "reverse_kl",
    "sampled_token_nll",
    "teacher_entropy",
    "teacher_topk_targets",
]
