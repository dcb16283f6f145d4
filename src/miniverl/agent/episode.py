"""One episode as a state machine, and the request that starts one in a batch.

:class:`Episode` holds everything that changes while a policy plays one task: the turn
counter, the transcript builder, the call-signature counts and the termination reason.
:meth:`~miniverl.agent.loop.RolloutRunner.rollout` (one episode) and
:meth:`~miniverl.agent.loop.RolloutRunner.rollout_batch` (many, decoded together) drive the
same object, which is why it lives apart from the runner that drives it: the runner owns the
decoding schedule, the episode owns what a turn means. It appends spans through the
runner's transcript helpers (``_add_model_spans``, ``_execute``, ``_add_observation``), so a
policy turn is rendered by the same code as an oracle turn.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from miniverl.agent.protocol import parse_assistant_text
from miniverl.agent.transcript import TranscriptBuilder
from miniverl.environments.base import Task, ToolEnvironment, ToolResult
from miniverl.schemas.trajectory import (
    SpanType,
    TerminationReason,
    ToolCallRecord,
    Trajectory,
    Turn,
    VerificationRecord,
)
from miniverl.utils.seeding import derive_seed

if TYPE_CHECKING:
    from miniverl.agent.loop import RolloutRunner
    from miniverl.models.base import GenerationResult


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to run in :meth:`RolloutRunner.rollout_batch`."""

    task: Task
    seed: int
    trajectory_id: str | None = None
    extra_metadata: dict[str, Any] | None = None


class Episode:
    """One episode as a state machine: ask for a generation, consume it, repeat.

    :meth:`RolloutRunner.rollout` and :meth:`RolloutRunner.rollout_batch` drive the same
    object, so termination reasons, spans and masks cannot differ between the two paths.
    """

    def __init__(
        self,
        runner: RolloutRunner,
        environment: ToolEnvironment,
        task: Task,
        seed: int,
        temperature: float,
        builder: TranscriptBuilder,
        extra_metadata: dict[str, Any] | None,
    ) -> None:
        self.runner, self.environment, self.task = runner, environment, task
        self.seed, self.temperature, self.builder = seed, temperature, builder
        self.extra_metadata = extra_metadata
        self.turn = 0
        self.done = False
        self.reason = TerminationReason.MAX_TURNS
        self.verification: VerificationRecord | None = None
        self.generated = self.invalid = self.parse_errors = 0
        self.signatures: Counter[str] = Counter()
        turn_limit = environment.turn_budget(task)
        max_turns = runner.config.max_turns
        self.max_turns = max_turns if turn_limit is None else min(max_turns, turn_limit)

    def next_request(self) -> tuple[list[int], int, int] | None:
        """``(prompt ids, token budget, seed)`` of the next turn, or None once terminated."""
        cfg = self.runner.config
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
        runner, builder, turn = self.runner, self.builder, self.turn
        cfg = runner.config
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
            runner._add_model_spans(
                builder, ids, generation.text, parsed.block_start, SpanType.ASSISTANT_FINAL, turn
            )
            builder.add_turn(Turn(turn_id=turn, is_final=True))
            self.verification = self.environment.verify(self.task, parsed.final_answer or "")
            self._end(TerminationReason.FINAL_ANSWER)
            return

        if parsed.kind == "tool_call" and parsed.tool_call is not None:
            call = parsed.tool_call
            runner._add_model_spans(
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
            if not runner._execute(builder, call, record, turn, self.environment).ok:
                self.invalid += 1
            return

        runner._add_model_spans(builder, ids, generation.text, None, SpanType.ASSISTANT_TEXT, turn)
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
        runner._add_observation(builder, ToolResult(ok=False, error=parsed.error), turn, call_id)

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


__all__ = ["Episode", "EpisodeRequest"]
