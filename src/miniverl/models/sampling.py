"""The one generation loop both backends share, plus the small helpers both backends need.

``ToyBackend.generate`` and ``HFBackend.generate`` differ only in their ``step`` function
(one forward of new positions against a KV cache, returning the last position's logits).
Everything a rollout's accounting depends on lives here, once: seeding, greedy vs
temperature/top-p sampling, stop strings checked on decoded text, EOS, ``max_new_tokens``
and the exact list of sampled ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from miniverl.errors import BackendError, CheckpointError, ConfigError
from miniverl.models.base import FinishReason, GenerationResult

if TYPE_CHECKING:
    from miniverl.schemas.text import TokenizerLike

StepFn = Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any]]
"""``step(input_ids [1, t] long, cache) -> (logits of the last position [1, V] or [V], cache)``.

Called once with the whole prompt and ``cache=None`` (prefill), then once per sampled token
with ``[1, 1]`` and the cache it returned last time."""


def run_generation(
    step: StepFn,
    prompt_ids: Sequence[int],
    *,
    tokenizer: TokenizerLike,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_sequences: Sequence[str] = (),
    eos_token_id: int | None = None,
    device: str | torch.device = "cpu",
) -> GenerationResult:
    """Sample up to ``max_new_tokens`` ids after ``prompt_ids``.

    - The prompt is run once (prefill); every further forward is exactly one new position
      against the KV cache, and ``step`` projects only the last position, so neither a full
      recompute nor ``[T, V]`` logits ever happen here.
    - ``temperature == 0`` is greedy (``argmax``, lowest id on ties). Otherwise logits are
      divided by the temperature, optionally restricted to the top-p nucleus, and one id is
      drawn by inverse CDF from a private ``torch.Generator`` seeded with ``seed``: the same
      seed gives the same ids on every device and whatever the global RNG state is.
    - Ending: EOS sampled (kept in ``token_ids``, not in ``text``), any stop string present in
      the decoded generated text (the ids that produced it are kept), or ``max_new_tokens``.
    """
    _check_sampling_args(max_new_tokens, temperature, top_p)
    if len(prompt_ids) == 0:
        raise BackendError(
            "generation needs a non-empty prompt",
            hint="pass at least the chat header tokens as prompt_ids",
        )
    stops = tuple(s for s in stop_sequences if s)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)

    token_ids: list[int] = []
    finish: FinishReason = "max_new_tokens"
    matched: str | None = None
    if max_new_tokens > 0:
        prompt = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        logits, cache = step(prompt, None)
        while True:
            token = sample_next_token(
                logits, temperature=temperature, top_p=top_p, generator=generator
            )
            token_ids.append(token)
            if eos_token_id is not None and token == eos_token_id:
                finish = "eos"
                break
            if stops:
                matched = first_stop_sequence(tokenizer.decode(token_ids), stops)
                if matched is not None:
                    finish = "stop_sequence"
                    break
            if len(token_ids) >= max_new_tokens:
                break
            next_input = torch.tensor([[token]], dtype=torch.long, device=device)
            logits, cache = step(next_input, cache)

    text_ids = token_ids[:-1] if finish == "eos" else token_ids
    return GenerationResult(
        token_ids=token_ids,
        text=tokenizer.decode(text_ids),
        finish_reason=finish,
        stop_sequence=matched,
        num_prompt_tokens=len(prompt_ids),
    )


BatchStepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, Any]]
"""``step(input_ids [B, t], key_mask [B, past + t], position_ids [B, t], cache) -> (logits [B, V], cache)``.

``key_mask`` says which cache slots (past and new) hold real tokens: 1 real, 0 padding or
a finished row's filler. Slots are in time order, so causality is by slot index; a row's
real positions are ``position_ids``, independent of how much padding sits before them.
Only the last new position of each row is projected."""


CacheSelectFn = Callable[[Any, torch.Tensor, torch.Tensor], Any]
"""``select(cache, rows [R] long, slots [S] long) -> cache`` of those batch rows and cache slots.

Returns None when the backend's cache object cannot be sliced (then every row is prefilled
from scratch). It may consume ``cache``: the caller never reuses the one it passed in."""


@dataclass
class PrefixCache:
    """A batch's KV cache kept across :func:`run_batched_generation` calls (multi-turn rollouts).

    Row ``r`` of ``cache`` holds the keys and values of the ids ``fed[r]``: its prompt plus
    every sampled id except the last, which was never fed back. A later call whose prompt
    starts with ``fed[r]`` (and is longer) reuses that row and prefills only the ids after
    it; any other prompt is prefilled whole. Rows are matched by content, not by caller
    identity, so reusing a row can never attend to another episode's tokens: equal ids at
    equal positions have equal keys and values. ``prefilled_tokens`` logs, per call, how
    many real tokens the prefill forwards ran (the figure the benchmark and tests watch),
    the shared prefix counted once.

    ``share_prefix``: when a call finds no row in the cache and every prompt starts with
    the same ids, those ids are prefilled once at batch size 1 and their keys and values
    are copied to every row (:func:`shared_prefix_length`); ``shared_prefix_tokens`` logs
    that length per call (0 when nothing was shared).
    """

    cache: Any = None
    key_mask: torch.Tensor | None = None
    fed: list[tuple[int, ...]] = field(default_factory=list)
    prefilled_tokens: list[int] = field(default_factory=list)
    share_prefix: bool = True
    shared_prefix_tokens: list[int] = field(default_factory=list)

    def take(
        self,
        prompts: Sequence[Sequence[int]],
        select: CacheSelectFn | None,
    ) -> tuple[Any, torch.Tensor | None, list[int]]:
        """``(cache, past key_mask [B, S], cached length per row)`` for ``prompts``; empties self.

        Rows with no usable prefix get cached length 0 and an all-zero past mask, so the
        cache content in their slots (copied from some other row) is never attended to.
        Slots that no selected row uses are dropped. The state is emptied first, so a call
        that fails (e.g. out of memory, then split and retried) cannot leave a cache that
        disagrees with ``fed``.
        """
        cache, key_mask, fed = self.cache, self.key_mask, self.fed
        self.cache, self.key_mask, self.fed = None, None, []
        lengths = [0] * len(prompts)
        if cache is None or key_mask is None or select is None or not fed:
            return None, None, lengths
        lookup: dict[tuple[int, ...], int] = {}
        for row, ids in enumerate(fed):
            lookup.setdefault(ids, row)
        sizes = sorted({len(ids) for ids in fed}, reverse=True)
        source: list[int | None] = []
        for r, prompt in enumerate(prompts):
            hit = None
            for n in sizes:
                if n < len(prompt) and (hit := lookup.get(tuple(prompt[:n]))) is not None:
                    lengths[r] = n
                    break
            source.append(hit)
        warm = [s for s in source if s is not None]
        if not warm:
            return None, None, [0] * len(prompts)
        rows = torch.tensor([warm[0] if s is None else s for s in source], dtype=torch.long)
        past = key_mask.index_select(0, rows.to(key_mask.device))
        cold = torch.tensor([s is None for s in source], device=past.device)
        past = past.masked_fill(cold[:, None], 0)
        slots = past.any(dim=0).nonzero().flatten()
        selected = select(cache, rows.to(past.device), slots)
        if selected is None:
            return None, None, [0] * len(prompts)
        return selected, past.index_select(1, slots), lengths


def run_batched_generation(
    step: BatchStepFn,
    prompts: Sequence[Sequence[int]],
    *,
    tokenizer: TokenizerLike,
    max_new_tokens: Sequence[int],
    seeds: Sequence[int],
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_sequences: Sequence[str] = (),
    eos_token_id: int | None = None,
    pad_token_id: int = 0,
    device: str | torch.device = "cpu",
    prefix_cache: PrefixCache | None = None,
    select_cache: CacheSelectFn | None = None,
) -> list[GenerationResult]:
    """:func:`run_generation` for ``B`` prompts at once; row ``r`` equals the unbatched call.

    - Prompts are **left-padded** to one width, so every row's last prompt token is the last
      column and one ``[B, 1]`` step per sampled token serves every row. ``key_mask`` hides
      the padding and ``position_ids`` count only real tokens, so each row sees exactly the
      keys and rotary positions it would see alone.
    - With a ``prefix_cache`` (and the backend's ``select_cache``), a row whose prompt
      extends ids already in the cache prefills only the new ids: they are left-padded
      into one block appended after the cached slots, at positions ``cached length + 0,
      1, ...``, with ``key_mask`` hiding the pads, the gaps between earlier blocks and any
      other row's slots. The cache of this call is kept for the next one. When no row is
      in the cache yet, the ids all prompts start with are prefilled once at batch size 1
      and copied to every row (``PrefixCache.share_prefix``), and each row prefills only
      the rest of its prompt in the same way.
    - Every row draws from its **own** ``torch.Generator`` seeded with ``seeds[r]`` and
      consumes one draw per sampled id, exactly like :func:`run_generation`: the ids of a
      row do not depend on which other rows share its batch (up to float rounding of the
      batched kernels, which can flip exact near-ties).
    - A row that ends (EOS, stop string, its own ``max_new_tokens[r]``) keeps its slot but
      feeds a masked filler token from then on; the loop ends when every row has ended.
    """
    if len(prompts) != len(max_new_tokens) or len(prompts) != len(seeds):
        raise BackendError(
            f"batched generation got {len(prompts)} prompts, {len(max_new_tokens)} budgets "
            f"and {len(seeds)} seeds",
            hint="pass one budget and one seed per prompt",
        )
    if not prompts:
        return []
    for budget in max_new_tokens:
        _check_sampling_args(budget, temperature, top_p)
    if any(len(p) == 0 for p in prompts):
        raise BackendError(
            "generation needs a non-empty prompt",
            hint="pass at least the chat header tokens as prompt_ids",
        )
    stops = tuple(s for s in stop_sequences if s)
    rows = len(prompts)
    generators = []
    for seed in seeds:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
        generators.append(generator)
    sampled: list[list[int]] = [[] for _ in range(rows)]
    finish: list[FinishReason] = ["max_new_tokens"] * rows
    matched: list[str | None] = [None] * rows
    active = [budget > 0 for budget in max_new_tokens]

    if any(active):
        cache, past_mask, cached = (
            prefix_cache.take(prompts, select_cache)
            if prefix_cache is not None
            else (None, None, [0] * rows)
        )
        shared = 0
        if prefix_cache is not None and prefix_cache.share_prefix and cache is None:
            cache, past_mask, shared = _prefill_shared_prefix(step, prompts, select_cache, device)
            cached = [shared] * rows
        new = [list(p[n:]) for p, n in zip(prompts, cached, strict=True)]
        width = max(len(ids) for ids in new)
        ids = torch.full((rows, width), int(pad_token_id), dtype=torch.long)
        mask = torch.zeros((rows, width), dtype=torch.long)
        positions = torch.zeros((rows, width), dtype=torch.long)
        for r, tokens in enumerate(new):
            ids[r, width - len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
            mask[r, width - len(tokens) :] = 1
            positions[r, :] = cached[r]
            positions[r, width - len(tokens) :] = torch.arange(
                cached[r], cached[r] + len(tokens), dtype=torch.long
            )
        next_position = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        key_mask = mask.to(device)
        if past_mask is not None:
            key_mask = torch.cat([past_mask.to(key_mask.dtype), key_mask], dim=1)
        if prefix_cache is not None:
            prefix_cache.prefilled_tokens.append(shared + sum(len(tokens) for tokens in new))
            prefix_cache.shared_prefix_tokens.append(shared)
        logits, cache = step(ids.to(device), key_mask, positions.to(device), cache)
        while True:
            column = [int(pad_token_id)] * rows
            alive_rows = [0] * rows
            drawn = sample_rows(
                logits.reshape(rows, -1, logits.shape[-1])[:, -1],
                [r for r in range(rows) if active[r]],
                temperature=temperature,
                top_p=top_p,
                generators=generators,
            )
            for r in range(rows):
                if not active[r]:
                    continue
                token = drawn[r]
                sampled[r].append(token)
                if eos_token_id is not None and token == eos_token_id:
                    finish[r], active[r] = "eos", False
                elif stops and (hit := first_stop_sequence(tokenizer.decode(sampled[r]), stops)):
                    finish[r], matched[r], active[r] = "stop_sequence", hit, False
                elif len(sampled[r]) >= max_new_tokens[r]:
                    active[r] = False
                else:
                    column[r] = token
                    alive_rows[r] = 1
            if not any(active):
                break
            alive = torch.tensor(alive_rows, dtype=torch.long)
            key_mask = torch.cat([key_mask, alive.unsqueeze(1).to(device)], dim=1)
            step_positions = next_position.unsqueeze(1).clone()
            next_position += alive
            step_ids = torch.tensor(column, dtype=torch.long).unsqueeze(1)
            logits, cache = step(step_ids.to(device), key_mask, step_positions.to(device), cache)
        if prefix_cache is not None:
            prefix_cache.cache, prefix_cache.key_mask = cache, key_mask
            prefix_cache.fed = [tuple(prompts[r]) + tuple(sampled[r][:-1]) for r in range(rows)]

    results = []
    for r in range(rows):
        text_ids = sampled[r][:-1] if finish[r] == "eos" else sampled[r]
        results.append(
            GenerationResult(
                token_ids=sampled[r],
                text=tokenizer.decode(text_ids),
                finish_reason=finish[r],
                stop_sequence=matched[r],
                num_prompt_tokens=len(prompts[r]),
            )
        )
    return results


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the ids every prompt starts with, capped one short of the shortest prompt.

    The cap leaves every row at least one id of its own to prefill, because a row's first
    logits come from its last prompt position. 0 for fewer than two prompts (nothing to
    share).
    """
    if len(prompts) < 2:
        return 0
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts[1:]):
        n += 1
    return n


def _prefill_shared_prefix(
    step: BatchStepFn,
    prompts: Sequence[Sequence[int]],
    select: CacheSelectFn | None,
    device: str | torch.device,
) -> tuple[Any, torch.Tensor | None, int]:
    """``(cache [B rows, P slots], past key_mask [B, P] of ones, P)`` for the common prefix.

    The prefix runs once as a ``[1, P]`` forward at positions ``0 .. P-1``; ``select``
    with row index 0 repeated ``B`` times copies its keys and values to every row, which
    is what each row would have computed for those ids alone. ``(None, None, 0)`` when
    there is no common prefix, or when the backend's cache cannot be indexed (a
    sliding-window layer): the prefix forward is then discarded and every row is
    prefilled whole.
    """
    length = shared_prefix_length(prompts) if select is not None else 0
    if select is None or length == 0:
        return None, None, 0
    ids = torch.tensor([list(prompts[0][:length])], dtype=torch.long, device=device)
    ones = torch.ones((1, length), dtype=torch.long, device=device)
    positions = torch.arange(length, dtype=torch.long, device=device).unsqueeze(0)
    _, cache = step(ids, ones, positions, None)
    rows = torch.zeros(len(prompts), dtype=torch.long, device=device)
    expanded = select(cache, rows, torch.arange(length, dtype=torch.long, device=device))
    if expanded is None:
        return None, None, 0
    return expanded, torch.ones((len(prompts), length), dtype=torch.long, device=device), length


def sample_rows(
    last: torch.Tensor,
    rows: Sequence[int],
    *,
    temperature: float,
    top_p: float,
    generators: Sequence[torch.Generator],
) -> dict[int, int]:
    """``{row: id}`` for each of ``rows`` of ``last: [B, V]``, each row exactly as
    :func:`sample_next_token` would draw it from ``generators[row]``.

    The softmax, CDF and search run once over the rows in one ``[n, V]`` float64 block
    (each row's reduction is the same kernel loop as alone, so the ids are the same); only
    the uniform draw stays per row, one from each row's own generator, in row order. A
    nucleus (``top_p < 1``) keeps a different number of ids per row, so it goes row by row.
    """
    if not rows:
        return {}
    if temperature == 0:
        picked = last.index_select(0, torch.tensor(rows, device=last.device)).argmax(dim=-1)
        return dict(zip(rows, picked.tolist(), strict=True))
    if top_p < 1.0:
        return {
            r: sample_next_token(
                last[r], temperature=temperature, top_p=top_p, generator=generators[r]
            )
            for r in rows
        }
    block = last.detach()
    if list(rows) != list(range(block.shape[0])):
        block = block.index_select(0, torch.tensor(rows, device=last.device))
    block = block.to("cpu", torch.float64)
    cdf = torch.cumsum(torch.softmax(block if temperature == 1 else block / temperature, -1), -1)
    total = cdf[:, -1:]
    if not bool(torch.isfinite(total).all()):
        raise BackendError(
            "the model produced non-finite logits during generation",
            hint="the weights have diverged; lower the learning rate or resume from an earlier checkpoint",
        )
    u = torch.tensor(
        [torch.rand((), generator=generators[r], dtype=torch.float64).item() for r in rows],
        dtype=torch.float64,
    )
    index = torch.searchsorted(cdf, u[:, None] * total, right=True).clamp_(max=cdf.shape[-1] - 1)
    return dict(zip(rows, index[:, 0].tolist(), strict=True))


def sample_next_token(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    generator: torch.Generator,
) -> int:
    """One id from last-position logits (``[V]`` or ``[1, V]``).

    Sampling happens on the CPU in float64 so the draw depends only on the logits and the
    generator, not on the device or its kernels.
    """
    last = logits.reshape(-1, logits.shape[-1])[-1]
    if temperature == 0:
        return int(torch.argmax(last).item())
    probs = torch.softmax(last.detach().to("cpu", torch.float64) / temperature, dim=-1)
    if not bool(torch.isfinite(probs).all()):
        raise BackendError(
            "the model produced non-finite logits during generation",
            hint="the weights have diverged; lower the learning rate or resume from an earlier checkpoint",
        )
    order: torch.Tensor | None = None
    if top_p < 1.0:
        probs, order = torch.sort(probs, descending=True, stable=True)
        keep = (torch.cumsum(probs, dim=0) - probs) < top_p
        probs, order = probs[keep], order[keep]
    cdf = torch.cumsum(probs, dim=0)
    u = torch.rand((), generator=generator, dtype=torch.float64) * cdf[-1]
    index = int(torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.numel() - 1).item())
    return int(order[index].item()) if order is not None else index


def first_stop_sequence(text: str, stops: Sequence[str]) -> str | None:
    """The stop string that occurs earliest in ``text`` (the longer one on a tie), or None."""
    best: tuple[int, int] | None = None
    found: str | None = None
    for stop in stops:
        at = text.find(stop)
        if at >= 0 and (best is None or (at, -len(stop)) < best):
            best, found = (at, -len(stop)), stop
    return found


def recompute_step(logits_fn: Callable[[torch.Tensor], torch.Tensor]) -> StepFn:
    """A cache-free reference ``step``: re-runs the whole sequence for every token.

    ``logits_fn(input_ids [1, T]) -> [1, T, V]`` is a model's plain full forward. The
    "cache" this step carries is just the ids so far. Tests and the benchmark compare it
    against the KV-cached steps; no backend uses it.
    """

    def step(input_ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        seq = input_ids if cache is None else torch.cat([cache, input_ids], dim=1)
        with torch.no_grad():
            logits = logits_fn(seq)
        return logits[:, -1, :], seq

    return step


def _check_sampling_args(max_new_tokens: int, temperature: float, top_p: float) -> None:
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not temperature >= 0:
        raise ConfigError(
            f"temperature must be >= 0, got {temperature}", hint="use 0 for greedy decoding"
        )
    if not 0 < top_p <= 1:
        raise ConfigError(
            f"top_p must be in (0, 1], got {top_p}", hint="use 1.0 to disable nucleus sampling"
        )


# ------------------------------------------------------------- shared backend tensor checks


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """Run under ``module.eval()`` and ``no_grad``, restoring the previous train flag.

    Every mode change goes through the root module, so its flag is the whole tree's: a
    module already in eval mode is not walked again (a walk is ~30 Python calls for the
    toy decoder, paid once per rollout turn).
    """
    was_training = module.training
    if was_training:
        module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        if was_training:
            module.train(True)


def position_tensor(
    positions: Sequence[int], length: int, device: str | torch.device
) -> torch.Tensor:
    """``[N]`` long tensor of positions, each checked to lie in ``[0, length)``."""
    index = torch.as_tensor(list(positions), dtype=torch.long)
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= length):
        bad = next(int(p) for p in index.tolist() if not 0 <= p < length)
        raise BackendError(
            f"position {bad} is outside the sequence [0, {length})",
            hint="positions are prediction positions j - 1 of targets j inside the same token_ids",
        )
    return index.to(device)


def check_right_padded(attention_mask: torch.Tensor) -> None:
    """Raise unless every ``[B, T]`` mask row is ones followed by zeros (right padding).

    Both backends rely on it: with right padding a real token's rotary position equals its
    index and causal attention never reaches a pad, so padding cannot change real rows.
    """
    if attention_mask.dim() != 2:
        raise BackendError(
            f"attention_mask must be [B, T], got shape {tuple(attention_mask.shape)}"
        )
    mask = attention_mask.to(torch.long)
    if attention_mask.shape[1] > 1 and bool((mask[:, 1:] > mask[:, :-1]).any()):
        raise BackendError(
            "padded batch is not right-padded (a real token follows a pad)",
            hint="build the batch with build_padded_trajectory_batch, which pads on the right",
        )


def load_parameters(
    targets: Mapping[str, torch.nn.Parameter],
    state: Mapping[str, torch.Tensor],
    *,
    strict: bool,
    what: str,
) -> None:
    """Copy ``state`` into ``targets`` after checking names and shapes; nothing is copied on error."""
    missing = sorted(set(targets) - set(state))
    unexpected = sorted(set(state) - set(targets))
    mismatched = [
        f"{name}: expected {tuple(targets[name].shape)}, got {tuple(state[name].shape)}"
        for name in sorted(set(targets) & set(state))
        if tuple(targets[name].shape) != tuple(state[name].shape)
    ]
    problems = []
    if strict and missing:
        problems.append(f"missing keys {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if strict and unexpected:
        problems.append(f"unexpected keys {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    if mismatched:
        problems.append("shape mismatch " + "; ".join(mismatched[:5]))
    if problems:
        raise CheckpointError(
            f"cannot load {what}: " + ", ".join(problems),
            hint="the state was saved from a different model shape or LoRA setting; load it into the same config",
        )
    with torch.no_grad():
        for name in set(targets) & set(state):
            param = targets[name]
            param.copy_(state[name].to(device=param.device, dtype=param.dtype))


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters that require grad, as detached CPU copies.

    Copies, not views: on CPU ``.to("cpu")`` would alias the live weights, and a saved
    checkpoint (or the swap strategy's host copy) must not keep changing with training.
    """
    return {
        name: p.detach().to("cpu", copy=True).contiguous()
        for name, p in module.named_parameters()
        if p.requires_grad
    }


def load_trainable_state(
    module: torch.nn.Module, state: Mapping[str, torch.Tensor], *, strict: bool, what: str
) -> None:
    """Inverse of :func:`trainable_state`, with the name and shape checks of :func:`load_parameters`."""
    targets = {name: p for name, p in module.named_parameters() if p.requires_grad}
    load_parameters(targets, state, strict=strict, what=what)


def gather_positions(hidden: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
    """``[B, T, H]`` -> ``[N, H]`` rows at ``flat_index`` into the flattened ``B * T`` axis."""
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat_index)


__all__ = [
    "BatchStepFn",
    "CacheSelectFn",
    "PrefixCache",
    "StepFn",
    "check_right_padded",
    "eval_mode",
    "first_stop_sequence",
    "gather_positions",
    "load_parameters",
    "load_trainable_state",
    "position_tensor",
    "recompute_step",
    "run_batched_generation",
    "run_generation",
    "sample_next_token",
    "sample_rows",
    "shared_prefix_length",
    "trainable_state",
]
