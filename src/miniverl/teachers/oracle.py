"""A teacher that is the environment's oracle policy, smoothed: competent at every state.

Why: on-policy distillation is expected to help when the teacher is right at the states the
*student* reaches, including those after the student's own errors. A fitted toy teacher
learns the oracle's path but stays poor after errors (docs/benchmark.md, "Runs so far"),
so a benchmark with it measures the teacher. This backend removes that confound: at any
state it puts ``1 - eps + eps / V`` on the oracle's next token and ``eps / V`` on every
other token (``models.oracle_teacher.smoothing`` = ``eps``). It is labelled in the
manifest (``capabilities.backend == "oracle"``) and never fitted. It lives among the teachers,
not the model backends, because it reads the agent protocol and the environment's oracle;
:func:`build_oracle_teacher` is how a run builds it (``training/assembly.py``).

The oracle's next token after ids ``x[0..p]`` (what position ``p`` predicts):

1. The current assistant turn starts after the last ``ASSISTANT_HEADER`` in the text; the
   turn's text so far is ``g``.
2. The task is found by its prompt (the first user message) among the tasks the teacher was
   given; the oracle state is the number of oracle calls the earlier tool results completed
   (``environments/oracle_state.py``, :func:`~miniverl.environments.oracle_state.steps_done_of_results`),
   and the correct action ``a`` is the next oracle call (after an error: the corrective
   re-call) or the final answer, rendered as oracle traces render it.
3. If ``g`` is a prefix of ``a`` the next text is the rest of ``a``. Text before the turn's
   first block is prose the parser skips, so while no block is open the oracle starts ``a``.
   Once a block is open, the oracle finishes *that* block the way the oracle writes a block
   of its kind: ``a`` when it is of that kind; when the student opened a tool call where the
   answer is due, the oracle's last call (a repeat the tool answers again); when it opened
   an answer where a call is due, the oracle's final answer. The student's block and that
   template are compared as *skeletons*, in which every value is a slot (a number, signed or
   not, or one of the operators ``+ - *``) and every other character is literal, and the
   oracle continues after the cheapest prefix alignment of the two (edit distance; a
   different value in a slot is free, a stray, missing or wrong literal costs 1), finishing a
   number the student is inside to the template's length. So a miscopied number or operator
   costs one wrong value, not a broken call (the tool's echo then shows the error and the
   next turn re-calls), and a slip in the syntax is stepped over rather than answered with
   an instruction to stop. (A first version closed the block at every position after any
   deviation; on-policy training on those targets learned to close calls everywhere, see
   docs/benchmark.md, "Runs so far".)
4. The next token is the first token of the tokenizer's encoding of that text (EOS when it
   is empty).

**Off-path targets** (``models.oracle_teacher.off_path``). The rule above, ``privileged``,
uses the oracle's own solution where the transcript does not determine the target: the
final-answer template holds the true final value even when no tool result shows it, and a
number the student miscopied is finished with the template's remaining digits. Two variants
keep every target derivable from the transcript, so the teacher's off-path targets are
realisable by a policy that sees only what the student sees:

- ``context``: the final answer is a template (and an action) only once a successful tool
  result shows its value; until then an answer block opened where a call is due is closed
  (no number is written into it), and the turn-start action stays the next needed call. A
  number is finished only when the student's digits so far begin the template's number;
  otherwise it is left as typed (the tool's echo then shows the error). Every other target
  is a character of the oracle's next call, whose numbers come from the task text and the
  previous tool result.
- ``turn_only``: the ``context`` targets, plus :meth:`OracleTeacher.target_mask`: after the
  first deviation inside a turn no position of that turn is supervised. The trainer drops
  those positions from the selection, so only on-path positions and the start of every turn
  (the corrective re-call after an error) carry loss.

Teacher-forced scoring (``hidden_states_at_batch`` + ``project``) returns the exact
distribution: the "hidden state" of a position is the one-hot ``[V]`` vector of its oracle
token and ``project`` turns one-hot rows into smoothed log-probabilities, so the chunked
losses, the cache and the teacher gate use this backend like any other.
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


def _aligned_rest(got: list[str], want: list[str], *, finish_any_number: bool = True) -> str:
    """What follows ``got`` in ``want`` under the cheapest prefix alignment of the two skeletons.

    Edit distance with unit costs: a substitution is free between elements of the same shape
    (:func:`_same_shape`), so a wrong number or operator costs nothing and a stray, missing or
    wrong literal costs 1. Among the prefixes ``want[:j]`` the cheapest alignment with all of
    ``got`` wins (the shortest on a tie: an extra element is taken as inserted); the rest is ``want[j:]``, after finishing a number
    that ``got`` ends inside to the length of the number it is aligned with. With
    ``finish_any_number`` False a number is finished only when its digits so far begin the
    aligned number (so the finished number is that one); otherwise it is left as typed.
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
    fill = ""
    if best and matched_number[best]:
        typed, target = got[-1].lstrip("-"), want[best - 1].lstrip("-")
        if finish_any_number or target.startswith(typed):
            fill = target[len(typed) :]
    return fill + "".join(want[best:])


def deviated_continuation(
    generated: str,
    action: str,
    templates: Mapping[str, str] | None = None,
    *,
    finish_any_number: bool = True,
) -> str:
    """The text the oracle continues with after ``generated`` when the turn should be ``action``.

    See the module docstring, point 3. Text before the turn's first block is prose the parser
    ignores, so until a block is open the oracle starts ``action``. Inside a block the
    continuation follows the *template* of that block's kind: ``action`` when it is of that
    kind, else ``templates[opening tag]`` (the oracle's own block of that kind: its last call,
    or its final answer), aligned by :func:`_aligned_rest` (``finish_any_number`` passed on).
    A block of a kind without a template is closed.
    """
    if action.startswith(generated):
        return action[len(generated) :]
    opened = [(generated.find(tag), tag, close) for tag, close in _BLOCKS if tag in generated]
    if not opened:
        return action
    start, tag, closer = min(opened)
    block = generated[start:]
    template = action if action.startswith(tag) else (templates or {}).get(tag)
    if template is None:
        return closer
    if template.startswith(block):
        return template[len(block) :]
    return _aligned_rest(_skeleton(block), _skeleton(template), finish_any_number=finish_any_number)


OFF_PATH_MODES = ("privileged", "context", "turn_only")
"""``models.oracle_teacher.off_path``: what the teacher targets after a deviation (module docstring)."""


def _shown(value: str, outcomes: Sequence[tuple[bool, str | None]]) -> bool:
    """``value`` is a whole field (:func:`_skeleton` element) of some successful tool result."""
    return any(ok and text is not None and value in _skeleton(text) for ok, text in outcomes)


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
        off_path: str = "privileged",
        model_id: str = "oracle-teacher",
        device: str = "cpu",
    ) -> None:
        if not 0.0 < smoothing < 1.0:
            raise BackendError(f"oracle teacher smoothing must be in (0, 1), got {smoothing}")
        if off_path not in OFF_PATH_MODES:
            raise BackendError(
                f"unknown oracle teacher off_path {off_path!r}",
                hint=f"models.oracle_teacher.off_path is one of {', '.join(OFF_PATH_MODES)}",
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
                **({} if self.off_path == "privileged" else {"off_path": self.off_path}),
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

    def _action(self, context: str) -> tuple[str, dict[str, str]]:
        """The oracle's correct action for the turn that follows ``context``, and its block
        templates by opening tag (:func:`deviated_continuation`): for a tool call, the call due
        (or, when the answer is due, the last call: a repeat the tool answers again); for an
        answer, the final answer."""
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
        expected = self._expected[task.prompt]
        outcomes = _tool_outcomes(context)
        done = steps_done_of_results(expected, outcomes)
        oracle = self.environment.oracle_solution(task)
        final = format_final(oracle.final_answer)
        templates: dict[str, str] = {}
        if self.off_path == "privileged" or _shown(oracle.final_answer, outcomes):
            templates[FINAL_OPEN] = final
        if oracle.tool_calls:
            templates[TOOL_CALL_OPEN] = format_tool_call(oracle.tool_calls[max(done - 1, 0)])
        if done < len(oracle.tool_calls):
            return format_tool_call(oracle.tool_calls[done]), templates
        if FINAL_OPEN not in templates and TOOL_CALL_OPEN in templates:
            return templates[TOOL_CALL_OPEN], templates
        return final, templates

    def _turn_states(
        self, token_ids: Sequence[int], positions: Sequence[int]
    ) -> list[tuple[str, str, dict[str, str]]]:
        """``(turn text so far, action, templates)`` of the turn each position ``p`` is in,
        the text being ``x[turn start .. p]``."""
        pieces = [self._piece(t) for t in token_ids]
        offsets = [0]
        for piece in pieces:
            offsets.append(offsets[-1] + len(piece))
        text = "".join(pieces)
        actions: dict[int, tuple[str, dict[str, str]]] = {}
        out: list[tuple[str, str, dict[str, str]]] = []
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
            action, templates = actions[turn_start]
            out.append((text[turn_start:upto], action, templates))
        return out

    def target_mask(self, token_ids: Sequence[int], target_positions: Sequence[int]) -> list[bool]:
        """Which target positions ``j`` get a target under ``off_path``: every one, except with
        ``turn_only``, where ``j`` is supervised only while the turn text before it
        (``x[turn start .. j - 1]``) is still a prefix of the oracle's action for that turn.

        So the first token of every turn (the corrective re-call after an error included) and
        the on-path tokens are supervised, and no position after the first deviation inside a
        turn is. The trainer drops the masked positions from the selection
        (``training/sources.py`` :func:`make_select_and_align`), so they carry no loss and the
        token-mean of the loss runs over the supervised positions only."""
        if self.off_path != "turn_only":
            return [True] * len(target_positions)
        states = self._turn_states(token_ids, [j - 1 for j in target_positions])
        return [action.startswith(generated) for generated, action, _ in states]

    def next_token_ids(self, token_ids: Sequence[int], positions: Sequence[int]) -> list[int]:
        """The oracle's next token after ``token_ids[: p + 1]`` for each ``p`` in ``positions``."""
        finish_any_number = self.off_path == "privileged"
        out: list[int] = []
        for generated, action, templates in self._turn_states(token_ids, positions):
            rest = deviated_continuation(
                generated, action, templates, finish_any_number=finish_any_number
            )
            ids = self.tokenizer.encode(rest) if rest else []
            out.append(ids[0] if ids else self.tokenizer.eos_token_id)
        return out

    def _one_hot(self, ids: Sequence[int]) -> torch.Tensor:
        hidden = torch.zeros((len(ids), self.tokenizer.vocab_size), device=self._device)
        if ids:
            index = torch.tensor(list(ids), dtype=torch.long, device=self._device)
            hidden[torch.arange(len(ids), device=self._device), index] = 1.0
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
        """``[N, V]`` one-hot rows -> smoothed log-probabilities ``[N, V]`` (nats)."""
        return self._low + hidden.to(torch.float32) * (self._high - self._low)

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
    """``models.oracle_teacher`` of a ``RunConfig``: the smoothed oracle over ``tasks``.

    ``tasks`` are every task the run's episodes may come from (its splits). The teacher
    gets its own environment instance, so it never shares episode state with a runner.
    """
    from miniverl.environments.registry import make_environment

    spec = config.models.oracle_teacher
    if spec is None:
        raise BackendError(
            "this config has no models.oracle_teacher",
            hint="set models.oracle_teacher.smoothing (recipes/toy_calc_chain_oracle.yaml)",
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
