"""A teacher that is the environment's oracle policy, smoothed, wherever that policy is defined.

Why: on-policy distillation is expected to help when the teacher is right at the states the
*student* reaches, including those after the student's own errors. This backend puts
``1 - eps + eps / V`` on the oracle's next token and ``eps / V`` on every other token
(``lab.oracle_teacher.smoothing`` = ``eps``). It is labelled in the manifest
(``capabilities.backend == "oracle"``) and never fitted. It lives in the lab, not among the
model backends, because it reads the agent protocol and the environment's oracle;
:func:`build_oracle_teacher` builds it and the lab hands it to the run
(``lab/teachers/prepare.py``); the run scores it like any teacher, through its
``target_mask`` where it has no target.

The oracle's next token after ids ``x[0..p]`` (what position ``p`` predicts):

1. The current assistant turn starts after the last ``ASSISTANT_HEADER`` in the text; the
   turn's text so far is ``g``.
2. The task is found by its prompt (the first user message) among the tasks the teacher was
   given; the oracle state is the number of oracle calls the earlier tool results completed
   (``environments/oracle_state.py``, :func:`~miniverl.environments.oracle_state.steps_done_of_results`),
   and the correct action ``a`` is the next oracle call (after an error: the corrective
   re-call) or, once every call is done, the final answer, rendered as oracle traces render it.
   Every character of ``a`` is derivable from the transcript: the operands come from the task
   text and the last tool result, the final value from the last tool result.
3. The continuation (:func:`deviated_continuation`): if ``g`` is a prefix of ``a``, the rest of
   ``a``. Text before the turn's first block is prose the parser skips, so while no block is
   open the oracle starts ``a``. Inside a block of ``a``'s kind the student's block and ``a``
   are compared as *skeletons*, in which every value is a slot (a number, signed or not, or one
   of the operators ``+ - *``) and every other character is literal, and the oracle continues
   after the cheapest prefix alignment (edit distance; a different value in a slot is free, a
   stray, missing or wrong literal costs 1). A number the student is typing is finished only
   while its digits begin the number of ``a`` it is aligned with.
4. **No target** where the continuation is undefined: inside a block of the other kind (an
   answer opened where a call is due, or a call where the answer is due), inside a number
   whose digits no longer begin ``a``'s (a miscopied number), and once the alignment has used
   ``a`` up. Such a position leaves the selection (:meth:`OracleTeacher.target_mask`), and its
   score row is uniform. The teacher never targets EOS inside a turn: ending an episode
   without an answer is never the oracle's action, and a "stop now" target at a state that
   looks like an on-path state is not a policy the student can realise.

**Off-path targets** (``lab.oracle_teacher.off_path``):

- ``context``: every defined target of point 3 (on the oracle's path, at every turn start,
  and inside a deviated block of the right kind where the alignment says what comes next).
- ``turn_only``: only the positions on the oracle's path of their turn (each turn start, the
  corrective re-call after an error, included); after the first deviation inside a turn no
  position of that turn is supervised.

Teacher-forced scoring (``hidden_states_at_batch`` + ``project``) returns the exact
distribution: the "hidden state" of a position is the one-hot ``[V]`` vector of its oracle
token (all zeros where there is no target) and ``project`` turns rows into smoothed
log-probabilities (uniform for an all-zero row), so the chunked losses, the cache and the
teacher gate use this backend like any other.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from miniverl.agent.protocol import format_final, format_tool_call
from miniverl.environments.base import Task, ToolEnvironment
from miniverl.environments.oracle_state import oracle_tool_results, steps_done_of_results
from miniverl.errors import BackendError
from miniverl.models.base import BackendCapabilities, GenerationResult, PaddedTrajectoryBatch
from miniverl.models.sampling import run_generation
from miniverl.schemas.text import (
    ASSISTANT_HEADER,
    FINAL_CLOSE,
    FINAL_OPEN,
    IM_END,
    IM_START,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESULT_CLOSE,
    TOOL_RESULT_OPEN,
    TokenizerLike,
)

_USER_HEADER = f"{IM_START}user\n"
_RESULT = re.compile(
    re.escape(_USER_HEADER + TOOL_RESULT_OPEN) + r"\n(.*?)\n" + re.escape(TOOL_RESULT_CLOSE), re.S
)
_FIELD = re.compile(r"-?\d+|.", re.S)
_OPERATORS = frozenset("+-*")
_BLOCKS = ((TOOL_CALL_OPEN, TOOL_CALL_CLOSE), (FINAL_OPEN, FINAL_CLOSE))


def _skeleton(text: str) -> list[str]:
    """``text`` as elements: each number (a digit run, with a ``-`` sign directly before it)
    is one, every other char another."""
    return _FIELD.findall(text)


def _slot(element: str) -> str | None:
    """The slot kind of a skeleton element (``"number"``, ``"operator"``), None for a literal."""
    if element.lstrip("-").isdigit():
        return "number"
    return "operator" if element in _OPERATORS else None


def _same_shape(got: str, want: str) -> bool:
    """Both the same slot kind (any values), or the same literal character."""
    kind = _slot(got)
    return kind == _slot(want) if kind is not None else got == want


def _align(got: list[str], want: list[str]) -> tuple[int, bool]:
    """The cheapest prefix alignment of skeleton ``got`` with ``want``: ``(j, number)``, where
    ``want[:j]`` is the aligned prefix and ``number`` says ``got``'s last element was
    substituted for the number ``want[j - 1]``.

    Edit distance with unit costs: a substitution is free between elements of the same shape
    (:func:`_same_shape`), so a wrong number or operator costs nothing and a stray, missing or
    wrong literal costs 1; the shortest prefix wins a tie (an extra element is taken as
    inserted).
    """
    n, m = len(got), len(want)
    row = list(range(m + 1))
    matched_number = [False] * (m + 1)
    for i in range(1, n + 1):
        new = [i] + [0] * m
        number = [False] * (m + 1)
        for j in range(1, m + 1):
            substitute = row[j - 1] + (0 if _same_shape(got[i - 1], want[j - 1]) else 1)
            new[j] = min(substitute, row[j] + 1, new[j - 1] + 1)
            number[j] = new[j] == substitute and _slot(got[i - 1]) == _slot(want[j - 1]) == "number"
        row, matched_number = new, number
    best = min(range(m + 1), key=lambda j: (row[j], j))
    return best, bool(best and matched_number[best])


def _aligned_rest(got: list[str], want: list[str]) -> str | None:
    """What follows ``got`` in ``want`` under :func:`_align`, or None where that is undefined.

    A number ``got`` ends inside is finished only while its characters (sign included) begin
    the number it is aligned with; a ``-`` typed where a number is due is that number's sign
    only if the number is negative. Otherwise (a miscopied number or sign, digits that would
    run into the template's next number) and when the rest is empty there is no target.
    """
    if got and got[-1] == "-" and (len(got) == 1 or _slot(got[-2]) != "number"):
        best, _ = _align(got[:-1], want)
        if best < len(want) and _slot(want[best]) == "number":
            if not want[best].startswith("-"):
                return None
            return want[best][1:] + "".join(want[best + 1 :])
    best, matched = _align(got, want)
    rest = "".join(want[best:])
    typing = bool(got) and _slot(got[-1]) == "number"
    if matched:
        typed, target = got[-1], want[best - 1]
        if not target.startswith(typed):
            return None
        rest = target[len(typed) :] + rest
    elif typing and rest[:1].isdigit():
        return None
    return rest or None


def deviated_continuation(generated: str, action: str) -> str | None:
    """The text the oracle continues with after ``generated`` when the turn should be
    ``action``; None where it is undefined (module docstring, points 3 and 4).

    Until a block is open the oracle starts ``action`` (text before the first block is prose
    the parser ignores). Inside a block of ``action``'s kind the continuation follows the
    skeleton alignment of :func:`_aligned_rest`; inside a block of the other kind there is none.
    """
    if action.startswith(generated):
        return action[len(generated) :] or None
    opened = [(generated.find(tag), tag) for tag, _ in _BLOCKS if tag in generated]
    if not opened:
        return action
    start, tag = min(opened)
    if not action.startswith(tag):
        return None
    block = generated[start:]
    if action.startswith(block):
        return action[len(block) :] or None
    return _aligned_rest(_skeleton(block), _skeleton(action))


OFF_PATH_MODES = ("context", "turn_only")
"""``lab.oracle_teacher.off_path``: ``context`` targets every position where the oracle's
continuation is defined; ``turn_only`` only the positions on the oracle's path of their turn."""


def _tool_outcomes(context: str) -> list[tuple[bool, str | None]]:
    """``(ok, result text)`` of every tool observation in ``context``, in order.

    Only observations that open a user message count, so text a policy writes inside its
    own turn never passes for a tool result.
    """
    out: list[tuple[bool, str | None]] = []
    for body in _RESULT.findall(context):
        try:
            payload = json.loads(body)
        except json.JSONDecodeError:
            out.append((False, None))
            continue
        ok = isinstance(payload, dict) and payload.get("ok") is True
        out.append((ok, payload.get("result") if ok else None))
    return out


class OracleTeacher:
    """``CausalLMBackend`` whose distribution is the smoothed oracle policy (module docstring).

    ``tasks`` are every task whose episodes it may see (the run's splits); ``environment``
    supplies their oracle solutions and tool results. Frozen: no parameters. It has no
    ``generate_batch``: there is no batched kernel to gain, and ``RolloutRunner`` then runs
    episodes one at a time, with the same trajectories (``agent/loop.py`` ``rollout_batch``).
    """

    def __init__(
        self,
        tokenizer: TokenizerLike,
        environment: ToolEnvironment,
        tasks: Sequence[Task],
        *,
        smoothing: float,
        off_path: str = "context",
        model_id: str = "oracle-teacher",
        device: str = "cpu",
    ) -> None:
        if not 0.0 < smoothing < 1.0:
            raise BackendError(f"oracle teacher smoothing must be in (0, 1), got {smoothing}")
        if off_path not in OFF_PATH_MODES:
            raise BackendError(
                f"unknown oracle teacher off_path {off_path!r}",
                hint=f"lab.oracle_teacher.off_path is one of {', '.join(OFF_PATH_MODES)}",
            )
        self.off_path = off_path
        self.tokenizer = tokenizer
        self.environment = environment
        self.smoothing = float(smoothing)
        self.model_id = model_id
        self._device = device
        self._tasks: dict[str, Task] = {}
        for task in tasks:
            self._tasks.setdefault(task.prompt, task)
        self._expected: dict[str, list[str]] = {}
        self._pieces: dict[int, str] = {}
        vocab = tokenizer.vocab_size
        self._low = math.log(self.smoothing / vocab)
        self._high = math.log(1.0 - self.smoothing + self.smoothing / vocab)
        self._uniform = -math.log(vocab)

    # -- identity and placement -------------------------------------------------------------

    @property
    def device(self) -> str:
        return self._device

    @property
    def capabilities(self) -> BackendCapabilities:
        vocab = self.tokenizer.vocab_size
        return BackendCapabilities(
            backend="oracle",
            model_id=self.model_id,
            revision=None,
            vocab_size=vocab,
            hidden_size=vocab,
            num_layers=0,
            num_parameters=0,
            num_trainable_parameters=0,
            precision="float32",
            quantization="none",
            lora=False,
            kv_cache=False,
            can_offload=True,
            device=self._device,
            extra={
                "smoothing": self.smoothing,
                "environment": self.environment.name,
                "tasks": len(self._tasks),
                "off_path": self.off_path,
            },
        )

    def set_train(self, mode: bool) -> None:
        return None

    def to_device(self, device: str) -> None:
        self._device = device

    def release(self) -> None:
        return None

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return []

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_trainable_state_dict(
        self, state: Mapping[str, torch.Tensor], *, strict: bool = True
    ) -> None:
        if state and strict:
            raise BackendError("the oracle teacher has no parameters to load")

    # -- the policy -------------------------------------------------------------------------

    def _piece(self, token_id: int) -> str:
        if token_id not in self._pieces:
            self._pieces[token_id] = self.tokenizer.decode([token_id])
        return self._pieces[token_id]

    def _action(self, context: str) -> str:
        """The oracle's correct action for the turn that follows ``context``: the next oracle
        call (after an error: the corrective re-call), or the final answer once every call
        is done."""
        start = context.find(_USER_HEADER)
        end = context.find(IM_END, start + len(_USER_HEADER)) if start >= 0 else -1
        prompt = context[start + len(_USER_HEADER) : end] if end >= 0 else None
        task = self._tasks.get(prompt) if prompt is not None else None
        if task is None:
            raise BackendError(
                "the oracle teacher was asked about an episode whose task it does not know",
                hint="build it with every task of the run (models/factory.py passes the splits)",
            )
        if task.prompt not in self._expected:
            self._expected[task.prompt] = oracle_tool_results(self.environment, task)
        done = steps_done_of_results(self._expected[task.prompt], _tool_outcomes(context))
        oracle = self.environment.oracle_solution(task)
        if done < len(oracle.tool_calls):
            return format_tool_call(oracle.tool_calls[done])
        return format_final(oracle.final_answer)

    def turn_states(
        self, token_ids: Sequence[int], positions: Sequence[int]
    ) -> list[tuple[str, str]]:
        """``(turn text so far, the oracle's action for the turn)`` of each position ``p``:
        the text is ``x[turn start .. p]``, so the pair says what ``p`` predicts."""
        pieces = [self._piece(t) for t in token_ids]
        offsets = [0]
        for piece in pieces:
            offsets.append(offsets[-1] + len(piece))
        text = "".join(pieces)
        actions: dict[int, str] = {}
        out: list[tuple[str, str]] = []
        for p in positions:
            upto = offsets[p + 1]
            header = text.rfind(ASSISTANT_HEADER, 0, upto)
            if header < 0:
                raise BackendError(
                    f"position {p} is not inside an assistant turn",
                    hint="the oracle teacher scores assistant tokens only",
                )
            turn_start = header + len(ASSISTANT_HEADER)
            if turn_start not in actions:
                actions[turn_start] = self._action(text[:header])
            out.append((text[turn_start:upto], actions[turn_start]))
        return out

    def _continuation(self, generated: str, action: str) -> str | None:
        if self.off_path == "turn_only" and not action.startswith(generated):
            return None
        return deviated_continuation(generated, action)

    def target_mask(self, token_ids: Sequence[int], target_positions: Sequence[int]) -> list[bool]:
        """Which target positions ``j`` carry a target: those whose state ``x[.. j - 1]`` has a
        defined continuation under ``off_path`` (module docstring).

        The trainer drops the others from the selection (``training/sources.py``
        :func:`make_select_and_align`), so they carry no loss and the token mean of the loss
        runs over the supervised positions only."""
        return [
            t is not None for t in self.next_token_ids(token_ids, [j - 1 for j in target_positions])
        ]

    def next_token_ids(
        self, token_ids: Sequence[int], positions: Sequence[int]
    ) -> list[int | None]:
        """The oracle's next token after ``token_ids[: p + 1]`` for each ``p`` in ``positions``;
        None where the oracle has no target (never EOS)."""
        out: list[int | None] = []
        for generated, action in self.turn_states(token_ids, positions):
            rest = self._continuation(generated, action)
            ids = self.tokenizer.encode(rest) if rest else []
            out.append(ids[0] if ids else None)
        return out

    def _one_hot(self, ids: Sequence[int | None]) -> torch.Tensor:
        """``[len(ids), V]``: one-hot rows, all zeros where ``ids`` holds None."""
        hidden = torch.zeros((len(ids), self.tokenizer.vocab_size), device=self._device)
        rows = [r for r, i in enumerate(ids) if i is not None]
        if rows:
            hidden[
                torch.tensor(rows, device=self._device),
                torch.tensor([ids[r] for r in rows], device=self._device),
            ] = 1.0
        return hidden

    def hidden_states_at(
        self, token_ids: list[int], positions: list[int], *, with_grad: bool = False
    ) -> torch.Tensor:
        """``[len(positions), V]``: the one-hot oracle token each position predicts."""
        if not token_ids:
            raise BackendError("hidden_states_at needs a non-empty token sequence")
        return self._one_hot(self.next_token_ids(token_ids, positions))

    def hidden_states_at_batch(
        self, batch: PaddedTrajectoryBatch, *, with_grad: bool = False
    ) -> torch.Tensor:
        """``[batch.num_positions, V]`` one-hot rows, row-wise as the batch gathers them."""
        ids: list[int] = []
        rows = batch.input_ids.tolist()
        lengths = batch.attention_mask.sum(dim=1).tolist()
        positions = batch.position_index.tolist()
        cursor = 0
        for row, size in enumerate(batch.row_sizes):
            real = rows[row][: int(lengths[row])]
            ids += self.next_token_ids(real, positions[cursor : cursor + size])
            cursor += size
        return self._one_hot(ids)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, V]`` one-hot rows -> smoothed log-probabilities ``[N, V]`` (nats); an all-zero
        row (no target) -> the uniform distribution."""
        hidden = hidden.to(torch.float32)
        smoothed = self._low + hidden * (self._high - self._low)
        empty = hidden.sum(dim=-1, keepdim=True) == 0
        return torch.where(empty, torch.full_like(smoothed, self._uniform), smoothed)

    def _step(self, input_ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        ids = input_ids[0].tolist() if cache is None else cache + input_ids[0].tolist()
        return self.project(self._one_hot(self.next_token_ids(ids, [len(ids) - 1]))), ids

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
        """Sample from the smoothed oracle with the shared sampler (``models/sampling.py``)."""
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

    def __repr__(self) -> str:
        return f"OracleTeacher({self.environment.name!r}, smoothing={self.smoothing})"


def build_oracle_teacher(
    config: Any, tokenizer: TokenizerLike, tasks: Sequence[Task], device: str = "cpu"
) -> OracleTeacher:
    """``lab.oracle_teacher`` of a ``RunConfig``: the smoothed oracle over ``tasks``.

    ``tasks`` are every task the run's episodes may come from (its splits). The teacher
    gets its own environment instance, so it never shares episode state with a runner.
    """
    from miniverl.environments.registry import make_environment
    from miniverl.lab.config import lab_of

    spec = lab_of(config).oracle_teacher
    if spec is None:
        raise BackendError(
            "this config has no lab.oracle_teacher",
            hint="set lab.oracle_teacher.smoothing (recipes/toy_calc_chain_oracle.yaml)",
        )
    environment = make_environment(config.environment.name, **config.environment.params)
    return OracleTeacher(
        tokenizer,
        environment,
        tasks,
        smoothing=spec.smoothing,
        off_path=spec.off_path,
        device=device,
    )


__all__ = ["OFF_PATH_MODES", "OracleTeacher", "build_oracle_teacher", "deviated_continuation"]
