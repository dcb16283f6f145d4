"""One episode as a state machine, and how a turn is written into a transcript.

:class:`Episode` holds everything that changes while a policy plays one task: the turn
counter, the transcript builder, the call-signature counts and the termination reason.
:meth:`~miniverl.agent.loop.RolloutRunner.rollout` (one episode) and
:meth:`~miniverl.agent.loop.RolloutRunner.rollout_batch` (many, decoded together) drive the
same object, which is why it lives apart from the runner that drives it: the runner owns the
decoding schedule, the episode owns what a turn means. The runner hands it the rollout
bounds and never the runner itself, so this module does not know the runner exists.

The turn writers :func:`add_model_spans`, :func:`execute_call` and :func:`add_observation`
live here too: the runner's scripted transcripts (oracle, corrective) call the same three,
so a policy turn is rendered by the same code as an oracle turn.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from miniverl.agent.protocol import format_observation, parse_assistant_text, token_index_at_char
from miniverl.agent.transcript import TranscriptBuilder
from miniverl.config.sections import RolloutConfig
from miniverl.environments.base import Task, ToolCall, ToolEnvironment, ToolResult
from miniverl.schemas.trajectory import (
    SpanType,
    TerminationReason,
    ToolCallRecord,
    ToolResultRecord,
    Trajectory,
    Turn,
    VerificationRecord,
)
from miniverl.utils.seeding import derive_seed

if TYPE_CHECKING:
    from miniverl.models.base import GenerationResult


def add_model_spans(
    builder: TranscriptBuilder,
    ids: list[int],
    text: str,
    block_start: int | None,
    block_type: SpanType,
    turn: int,
    *,
    tool_name: str | None = None,
    tool_call_id: str | None = None,
) -> None:
    """Append sampled ids verbatim: prose before the block as assistant_text, the block typed.

    ``block_start`` is a character offset into ``text`` (``None``: all prose); the token
    split point is found by decoding prefixes of ``ids``, never by re-tokenizing ``text``.
    """
    split = (
        len(ids)
        if block_start is None
        else token_index_at_char(builder.tokenizer, ids, block_start)
    )
    builder.add_model(
        SpanType.ASSISTANT_TEXT, ids[:split], segment_key=f"gen:{turn}:prose", turn_id=turn
    )
    builder.add_model(
        block_type,
        ids[split:],
        segment_key=f"gen:{turn}:block",
        turn_id=turn,
        tool_name=tool_name,
        tool_call_id=tool_call_id,
    )


def add_observation(
    builder: TranscriptBuilder, result: ToolResult, turn: int, call_id: str
) -> None:
    """Append a tool result as user context that closes the turn and opens the next one."""
    builder.add_context(
        SpanType.TOOL_RESULT,
        "user",
        format_observation(result.observation_text()),
        segment_key=f"obs:{turn}",
        turn_id=turn,
        close_previous=True,
        open_next_assistant=True,
        tool_call_id=call_id,
        env_state_id=result.env_state_id,
    )


def execute_call(
    builder: TranscriptBuilder,
    environment: ToolEnvironment,
    call: ToolCall,
    record: ToolCallRecord,
    turn: int,
) -> ToolResult:
    """Run one tool call, record the turn and append the observation as context."""
    result = environment.step(call)
    builder.add_turn(
        Turn(
            turn_id=turn,
            tool_call=record,
            tool_result=ToolResultRecord(
                call_id=record.call_id,
                ok=result.ok,
                result=result.result,
                error=result.error,
                env_state_id=result.env_state_id,
            ),
        )
    )
    add_observation(builder, result, turn, record.call_id)
    return result


class Episode:
    """One episode as a state machine: ask for a generation, consume it, repeat.

    :meth:`RolloutRunner.rollout` and :meth:`RolloutRunner.rollout_batch` drive the same
    object, so termination reasons, spans and masks cannot differ between the two paths.
    ``config`` holds the episode's bounds (turns, tokens, repeated calls, parse errors).
    """

    def __init__(
        self,
        config: RolloutConfig,
        environment: ToolEnvironment,
        task: Task,
        seed: int,
        temperature: float,
        builder: TranscriptBuilder,
        extra_metadata: dict[str, Any] | None,
    ) -> None:
        self.config, self.environment, self.task = config, environment, task
        self.seed, self.temperature, self.builder = seed, temperature, builder
        self.extra_metadata = extra_metadata
        self.turn = 0
        self.done = False
        self.reason = TerminationReason.MAX_TURNS
        self.verification: VerificationRecord | None = None
        self.generated = self.invalid = self.parse_errors = 0
        self.signatures: Counter[str] = Counter()
        turn_limit = environment.turn_budget(task)
        max_turns = config.max_turns
        self.max_turns = max_turns if turn_limit is None else min(max_turns, turn_limit)

    def next_request(self) -> tuple[list[int], int, int] | None:
        """``(prompt ids, token budget, seed)`` of the next turn, or None once terminated."""
        cfg = self.config
        if self.done:
            return None
        if self.turn >= self.max_turns:
            self.done = True
            return None
        budget = min(cfg.max_new_tokens_per_turn, cfg.max_total_tokens - len(self.builder))
        if budget <= 0:
            self.reason = TerminationReason.MAX_TOKENS
            self.done = True
            return None
        return list(self.builder.token_ids), budget, derive_seed(self.seed, "turn", self.turn)

    def consume(self, generation: GenerationResult) -> None:
        """Append one turn's sampled ids and run its tool call, or record why it ended."""
        cfg, builder, turn = self.config, self.builder, self.turn
        self.turn += 1
        ids = list(generation.token_ids)
        self.generated += len(ids)
        if not ids:
            builder.add_turn(Turn(turn_id=turn))
            self._end(TerminationReason.EOS_WITHOUT_FINAL)
            return
        parsed = parse_assistant_text(generation.text)
        call_id = f"c{turn}"

        if parsed.kind == "final":
            add_model_spans(
                builder, ids, generation.text, parsed.block_start, SpanType.ASSISTANT_FINAL, turn
            )
            builder.add_turn(Turn(turn_id=turn, is_final=True))
            self.verification = self.environment.verify(self.task, parsed.final_answer or "")
            self._end(TerminationReason.FINAL_ANSWER)
            return

        if parsed.kind == "tool_call" and parsed.tool_call is not None:
            call = parsed.tool_call
            add_model_spans(
                builder,
                ids,
                generation.text,
                parsed.block_start,
                SpanType.ASSISTANT_TOOL_CALL,
                turn,
                tool_name=call.name,
                tool_call_id=call_id,
            )
            record = ToolCallRecord(
                call_id=call_id, name=call.name, arguments=call.arguments, raw_text=generation.text
            )
            self.signatures[call.signature()] += 1
            if self.signatures[call.signature()] - 1 > cfg.max_repeated_calls:
                builder.add_turn(Turn(turn_id=turn, tool_call=record))
                self._end(TerminationReason.REPEATED_CALL_LIMIT)
                return
            if not execute_call(builder, self.environment, call, record, turn).ok:
                self.invalid += 1
            return

        add_model_spans(builder, ids, generation.text, None, SpanType.ASSISTANT_TEXT, turn)
        builder.add_turn(
            Turn(
                turn_id=turn,
                tool_call=ToolCallRecord(
                    call_id=call_id,
                    name="<unparsed>",
                    raw_text=generation.text,
                    valid=False,
                    parse_error=parsed.error,
                ),
            )
        )
        self.invalid += 1
        self.parse_errors += 1
        if generation.finish_reason == "eos":
            self._end(TerminationReason.EOS_WITHOUT_FINAL)
            return
        if self.parse_errors >= max(1, cfg.max_parse_errors):
            self._end(TerminationReason.PARSE_ERROR_LIMIT)
            return
        add_observation(
            builder, self.environment.parse_error(parsed.error or "error"), turn, call_id
        )

    def _end(self, reason: TerminationReason) -> None:
        self.reason, self.done = reason, True

    def finish(self, policy_fingerprint: str | None) -> Trajectory:
        """The trajectory, stamped with the fingerprint of the weights that sampled it."""
        task = self.task
        metadata = {
            "source": "policy",
            "seed": self.seed,
            "temperature": self.temperature,
            "policy_fingerprint": policy_fingerprint,
            "difficulty": task.difficulty,
            "split": task.split,
            **(self.extra_metadata or {}),
        }
        return self.builder.build(
            termination_reason=self.reason,
            verification=self.verification,
            generated_token_count=self.generated,
            invalid_tool_calls=self.invalid,
            metadata=metadata,
        )


__all__ = ["Episode", "add_model_spans", "add_observation", "execute_call"]
