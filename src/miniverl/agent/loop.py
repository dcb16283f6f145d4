"""The rollout runner: one multi-turn episode in a tool environment.

Every exit path sets exactly one :class:`TerminationReason`, so a report's failure
taxonomy is exact. Model segments are the sampled ids verbatim; where the policy wrote
prose before a block, the split point comes from :func:`token_index_at_char`, which
decodes prefixes of the sampled ids instead of re-tokenizing text.

The turn-by-turn state of one episode (what a sampled turn means, when the episode ends) is
:class:`~miniverl.agent.episode.Episode`, and so are the turn writers every transcript
shares; this module decides what is decoded when, and renders the scripted transcripts
(oracle, corrective, privileged).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from miniverl.agent.episode import Episode, add_observation, execute_call
from miniverl.agent.protocol import (
    format_final,
    format_tool_call,
    parse_assistant_text,
    stop_sequences,
)
from miniverl.agent.transcript import SegmentIds, TranscriptBuilder
from miniverl.config.sections import RolloutConfig
from miniverl.environments.base import (
    Task,
    ToolCall,
    ToolEnvironment,
    check_turn_budget,
)
from miniverl.models.fingerprint import backend_fingerprint
from miniverl.schemas.text import TOOL_CALL_CLOSE, TokenizerLike
from miniverl.schemas.trajectory import (
    SpanType,
    TerminationReason,
    ToolCallRecord,
    Trajectory,
    Turn,
)
from miniverl.trajectory.alignment import segment_key_of

if TYPE_CHECKING:
    from miniverl.models.base import CausalLMBackend, GenerationResult

PRIVILEGED_SEGMENT_KEY = "priv"

ORACLE_CACHE_SIZE = 4096
"""Oracle traces one runner keeps (a few KB each); past it the oldest is rebuilt on demand."""

BatchSplitter = Callable[
    [Callable[[list[Any]], list["GenerationResult"]], list[Any]], list["GenerationResult"]
]
"""``split(decode, requests) -> results``: how a batched round is run (e.g. halved on OOM)."""


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to run in :meth:`RolloutRunner.rollout_batch`."""

    task: Task
    seed: int
    trajectory_id: str | None = None
    extra_metadata: dict[str, Any] | None = None


class RolloutRunner:
    """Runs episodes of ``environment`` with ``backend`` as the policy."""

    def __init__(
        self,
        backend: CausalLMBackend,
        environment: ToolEnvironment,
        config: RolloutConfig | None = None,
        *,
        tokenizer: TokenizerLike | None = None,
        model_id: str | None = None,
        model_revision: str | None = None,
        incremental_prefill: bool = True,
        share_prefix: bool = True,
    ) -> None:
        self.backend = backend
        self.incremental_prefill = incremental_prefill
        self.share_prefix = share_prefix
        self.environment = environment
        self.config = config or RolloutConfig()
        self.tokenizer: TokenizerLike = tokenizer or backend.tokenizer
        check_turn_budget(environment, self.config.max_turns)
        caps = getattr(backend, "capabilities", None)
        self.model_id = model_id or (caps.model_id if caps is not None else "unknown")
        self.model_revision = (
            model_revision if model_revision is not None else getattr(caps, "revision", None)
        )
        self._oracle_traces: dict[str, Trajectory] = {}
        self._oracle_inputs: tuple[Any, ...] | None = None
        self._segment_ids = SegmentIds(self.tokenizer)

    # -- building blocks ------------------------------------------------------------

    def _shared_segment_ids(self) -> SegmentIds:
        """This runner's segment-id cache, started afresh when ``tokenizer`` was replaced."""
        if self._segment_ids.tokenizer is not self.tokenizer:
            self._segment_ids = SegmentIds(self.tokenizer)
        return self._segment_ids

    def _new_builder(
        self, task: Task, *, trajectory_id: str, policy_version: int
    ) -> TranscriptBuilder:
        """A transcript holding the system and user context (user carries the assistant header).

        Every transcript of this runner shares one :class:`SegmentIds`, so the system
        prompt and each task's user turn are tokenized once per runner, not once per episode.
        """
        builder = TranscriptBuilder(
            self.tokenizer,
            trajectory_id=trajectory_id,
            task_id=task.task_id,
            environment=self.environment.name,
            model_id=self.model_id,
            model_revision=self.model_revision,
            policy_version=policy_version,
            segment_ids=self._shared_segment_ids(),
        )
        builder.add_context(
            SpanType.SYSTEM,
            "system",
            self.environment.system_prompt(),
            segment_key="sys",
            open_next_assistant=False,
        )
        builder.add_context(
            SpanType.USER, "user", task.prompt, segment_key="user", open_next_assistant=True
        )
        return builder

    # -- episodes -----------------------------------------------------------------

    def rollout(
        self,
        task: Task,
        seed: int,
        *,
        policy_version: int = 0,
        temperature: float | None = None,
        trajectory_id: str | None = None,
        extra_metadata: dict[str, Any] | None = None,
    ) -> Trajectory:
        """Sample one episode from the policy; exactly one termination reason per exit."""
        episode = self._start_episode(
            task,
            seed,
            self.environment,
            policy_version=policy_version,
            temperature=temperature,
            trajectory_id=trajectory_id,
            extra_metadata=extra_metadata,
        )
        while (request := episode.next_request()) is not None:
            prompt, budget, turn_seed = request
            episode.consume(
                self.backend.generate(
                    prompt,
                    max_new_tokens=budget,
                    temperature=episode.temperature,
                    seed=turn_seed,
                    stop_sequences=stop_sequences(),
                )
            )
        return episode.finish(backend_fingerprint(self.backend))

    def rollout_batch(
        self,
        requests: Sequence[EpisodeRequest],
        *,
        batch_size: int | None = None,
        policy_version: int = 0,
        temperature: float | None = None,
        split: BatchSplitter | None = None,
    ) -> list[Trajectory]:
        """Turn-synchronous episodes: each round, every live episode decodes its turn together.

        Episodes are cut into groups of ``batch_size`` (``None``: one group). Within a
        group, every round collects each live episode's prompt (its whole transcript so
        far), decodes all of them in one left-padded batch (``backend.generate_batch``), and
        hands each episode its own result; tools run per episode on a private shallow copy
        of the environment. The group's KV cache outlives the round (a
        :class:`~miniverl.models.sampling.PrefixCache`, when the backend has
        ``supports_prefix_cache`` and ``incremental_prefill`` is on), so the next round
        prefills only each episode's new ids: its last sampled id, the tool result and the
        next assistant header; ``incremental_prefill=False`` re-prefills whole transcripts.
        In the first round the ids every episode's prompt starts with (system prompt, tool
        protocol) are prefilled once for the group (``share_prefix``, on by default). Each
        episode samples from the seeds it would use alone, so the
        trajectories equal :meth:`rollout`'s, episode for episode (up to float rounding of
        the batched kernels). ``batch_size == 1`` or a backend without ``generate_batch``
        runs :meth:`rollout` one episode at a time. ``split(decode, requests)`` may wrap
        each round's decode, e.g. to halve a round that runs out of memory (decoding is a
        pure function of ``(prompt, budget, seed)``, so a split round gives the same ids).
        """
        size = len(requests) if batch_size is None else int(batch_size)
        if size < 1:
            raise ValueError("batch_size must be >= 1")
        batched = size > 1 and hasattr(self.backend, "generate_batch")
        out: list[Trajectory] = []
        for start in range(0, len(requests), size):
            group = requests[start : start + size]
            if not batched:
                out.extend(
                    self.rollout(
                        r.task,
                        r.seed,
                        policy_version=policy_version,
                        temperature=temperature,
                        trajectory_id=r.trajectory_id,
                        extra_metadata=r.extra_metadata,
                    )
                    for r in group
                )
                continue
            episodes = [
                self._start_episode(
                    r.task,
                    r.seed,
                    copy.copy(self.environment),
                    policy_version=policy_version,
                    temperature=temperature,
                    trajectory_id=r.trajectory_id,
                    extra_metadata=r.extra_metadata,
                )
                for r in group
            ]
            temp = episodes[0].temperature if episodes else 0.0
            prefix = self._prefix_cache()
            while True:
                live = [(e, e.next_request()) for e in episodes]
                live = [(e, req) for e, req in live if req is not None]
                if not live:
                    break

                def decode(
                    batch: list[tuple[list[int], int, int]],
                    temp: float = temp,
                    prefix: dict[str, Any] = prefix,
                ) -> list[GenerationResult]:
                    return self.backend.generate_batch(  # type: ignore[attr-defined,no-any-return]
                        [prompt for prompt, _, _ in batch],
                        max_new_tokens=[budget for _, budget, _ in batch],
                        seeds=[seed for _, _, seed in batch],
                        temperature=temp,
                        stop_sequences=stop_sequences(),
                        **prefix,
                    )

                turn_requests = [req for _, req in live]
                results = decode(turn_requests) if split is None else split(decode, turn_requests)
                for (episode, _), generation in zip(live, results, strict=True):
                    episode.consume(generation)
            fingerprint = backend_fingerprint(self.backend)
            out.extend(e.finish(fingerprint) for e in episodes)
        return out

    def _prefix_cache(self) -> dict[str, Any]:
        """``generate_batch`` keyword arguments that keep one group's KV cache across rounds."""
        if not (self.incremental_prefill and getattr(self.backend, "supports_prefix_cache", False)):
            return {}
        from miniverl.models.sampling import PrefixCache

        return {"prefix_cache": PrefixCache(share_prefix=self.share_prefix)}

    def _start_episode(
        self,
        task: Task,
        seed: int,
        environment: ToolEnvironment,
        *,
        policy_version: int,
        temperature: float | None,
        trajectory_id: str | None,
        extra_metadata: dict[str, Any] | None,
    ) -> Episode:
        builder = self._new_builder(
            task,
            trajectory_id=trajectory_id or f"{task.task_id}:v{policy_version}:s{seed}",
            policy_version=policy_version,
        )
        environment.reset(task)
        temp = self.config.temperature if temperature is None else temperature
        return Episode(self.config, environment, task, seed, temp, builder, extra_metadata)

    def oracle_rollout(
        self, task: Task, *, trajectory_id: str | None = None, policy_version: int = 0
    ) -> Trajectory:
        """The environment's reference solution, rendered exactly as a policy turn would be.

        The oracle's "generated" ids are the tokenization of its canonical text; they are
        the targets of SFT and the training data of the toy teacher.

        The trace is a pure function of the task, the environment, the tokenizer and the
        model id / revision, and an SFT run asks for the same task every few cycles, so it
        is rendered once per task and kept (:data:`ORACLE_CACHE_SIZE`); replacing any of
        those four attributes of the runner empties the cache. Each call returns a deep
        copy carrying its own ``trajectory_id`` and ``policy_version``, so a caller that
        edits its trajectory never changes another's. A cached call does not reset or step
        the environment.
        """
        inputs = (self.environment, self.tokenizer, self.model_id, self.model_revision)
        if self._oracle_inputs is None or any(
            a is not b for a, b in zip(inputs, self._oracle_inputs, strict=True)
        ):
            self._oracle_traces.clear()
            self._oracle_inputs = inputs
        key = repr(task)
        trace = self._oracle_traces.get(key)
        if trace is None:
            trace = self._render_oracle(task)
            if len(self._oracle_traces) >= ORACLE_CACHE_SIZE:
                del self._oracle_traces[next(iter(self._oracle_traces))]
            self._oracle_traces[key] = trace
        return trace.model_copy(
            deep=True,
            update={
                "trajectory_id": trajectory_id or f"{task.task_id}:oracle",
                "policy_version": policy_version,
            },
        )

    def _render_oracle(self, task: Task) -> Trajectory:
        """One oracle trace, named ``<task>:oracle`` at policy version 0."""
        builder = self._new_builder(task, trajectory_id=f"{task.task_id}:oracle", policy_version=0)
        self.environment.reset(task)
        oracle = self.environment.oracle_solution(task)
        generated = 0
        for turn, call in enumerate(oracle.tool_calls):
            ids = self.tokenizer.encode(format_tool_call(call))
            call_id = f"c{turn}"
            builder.add_model(
                SpanType.ASSISTANT_TOOL_CALL,
                ids,
                segment_key=f"gen:{turn}:block",
                turn_id=turn,
                tool_name=call.name,
                tool_call_id=call_id,
            )
            generated += len(ids)
            record = ToolCallRecord(
                call_id=call_id,
                name=call.name,
                arguments=call.arguments,
                raw_text=format_tool_call(call),
            )
            execute_call(builder, self.environment, call, record, turn)
        final_turn = len(oracle.tool_calls)
        ids = self.tokenizer.encode(format_final(oracle.final_answer))
        builder.add_model(
            SpanType.ASSISTANT_FINAL, ids, segment_key=f"gen:{final_turn}:block", turn_id=final_turn
        )
        builder.add_turn(Turn(turn_id=final_turn, is_final=True))
        generated += len(ids)
        return builder.build(
            termination_reason=TerminationReason.FINAL_ANSWER,
            verification=self.environment.verify(task, oracle.final_answer),
            generated_token_count=generated,
            metadata={"source": "oracle", "difficulty": task.difficulty, "split": task.split},
        )

    def corrective_rollout(self, task: Task, noise: str) -> Trajectory:
        """A noise-injected first turn, the environment's answer to it, then the oracle.

        ``noise`` is ``"malformed"`` (a tool call whose JSON is cut short: a parse-error
        observation, exactly as :meth:`rollout` writes one) or ``"wrong_tool"`` (a call to
        a tool that does not exist: the environment's error). The turns after the noise
        are the oracle's. ``metadata["supervise_from"]`` is the first position of the
        correction, so a fit can train on recovering from the mistake without training
        on the mistake itself.
        """
        builder = self._new_builder(
            task, trajectory_id=f"{task.task_id}:corrective-{noise}", policy_version=0
        )
        self.environment.reset(task)
        oracle = self.environment.oracle_solution(task)
        first = oracle.tool_calls[0] if oracle.tool_calls else ToolCall("calculator", {})
        if noise == "malformed":
            text = format_tool_call(first)[: -len("}\n" + TOOL_CALL_CLOSE)] + "\n" + TOOL_CALL_CLOSE
            parsed = parse_assistant_text(text)
            builder.add_model(
                SpanType.ASSISTANT_TEXT,
                self.tokenizer.encode(text),
                segment_key="gen:0:prose",
                turn_id=0,
            )
            builder.add_turn(
                Turn(
                    turn_id=0,
                    tool_call=ToolCallRecord(
                        call_id="c0",
                        name="<unparsed>",
                        raw_text=text,
                        valid=False,
                        parse_error=parsed.error,
                    ),
                )
            )
            add_observation(builder, self.environment.parse_error(parsed.error or "error"), 0, "c0")
        elif noise == "wrong_tool":
            call = ToolCall(f"{first.name}_tool", dict(first.arguments))
            text = format_tool_call(call)
            builder.add_model(
                SpanType.ASSISTANT_TOOL_CALL,
                self.tokenizer.encode(text),
                segment_key="gen:0:block",
                turn_id=0,
                tool_name=call.name,
                tool_call_id="c0",
            )
            record = ToolCallRecord(
                call_id="c0", name=call.name, arguments=call.arguments, raw_text=text
            )
            execute_call(builder, self.environment, call, record, 0)
        else:
            raise ValueError(f"unknown noise {noise!r}; expected malformed or wrong_tool")
        supervise_from = len(builder)
        generated = 0
        for k, call in enumerate(oracle.tool_calls):
            turn = k + 1
            ids = self.tokenizer.encode(format_tool_call(call))
            builder.add_model(
                SpanType.ASSISTANT_TOOL_CALL,
                ids,
                segment_key=f"gen:{turn}:block",
                turn_id=turn,
                tool_name=call.name,
                tool_call_id=f"c{turn}",
            )
            generated += len(ids)
            record = ToolCallRecord(
                call_id=f"c{turn}",
                name=call.name,
                arguments=call.arguments,
                raw_text=format_tool_call(call),
            )
            execute_call(builder, self.environment, call, record, turn)
        final_turn = len(oracle.tool_calls) + 1
        ids = self.tokenizer.encode(format_final(oracle.final_answer))
        builder.add_model(
            SpanType.ASSISTANT_FINAL, ids, segment_key=f"gen:{final_turn}:block", turn_id=final_turn
        )
        builder.add_turn(Turn(turn_id=final_turn, is_final=True))
        return builder.build(
            termination_reason=TerminationReason.FINAL_ANSWER,
            verification=self.environment.verify(task, oracle.final_answer),
            generated_token_count=generated + len(ids),
            invalid_tool_calls=1,
            metadata={
                "source": "corrective",
                "noise": noise,
                "supervise_from": supervise_from,
                "difficulty": task.difficulty,
                "split": task.split,
            },
        )

    def privileged_render(self, trajectory: Trajectory, task: Task) -> Trajectory:
        """The student's transcript with an oracle system block inserted before it.

        Every student segment keeps its ``segment_key`` and its exact token ids; only the
        absolute positions shift. ``build_alignment_map`` recomputes the shift per span
        and verifies the target ids, so nothing here has to be trusted.
        """
        builder = TranscriptBuilder(
            self.tokenizer,
            trajectory_id=f"{trajectory.trajectory_id}:privileged",
            task_id=trajectory.task_id,
            environment=trajectory.environment,
            model_id=trajectory.model_id,
            model_revision=trajectory.model_revision,
            policy_version=trajectory.policy_version,
            segment_ids=self._shared_segment_ids(),
        )
        builder.add_context(
            SpanType.SYSTEM,
            "system",
            self.environment.privileged_context(task),
            segment_key=PRIVILEGED_SEGMENT_KEY,
            open_next_assistant=False,
        )
        for span in trajectory.spans:
            builder.add(
                span.span_type,
                segment_key=segment_key_of(span),
                token_ids=trajectory.token_ids[span.start : span.end],
                text=span.text,
                turn_id=span.turn_id,
                tool_name=span.tool_name,
                tool_call_id=span.tool_call_id,
                env_state_id=span.env_state_id,
            )
        builder.turns = list(trajectory.turns)
        return builder.build(
            termination_reason=trajectory.termination_reason,
            verification=trajectory.verification,
            generated_token_count=trajectory.generated_token_count,
            invalid_tool_calls=trajectory.invalid_tool_calls,
            metadata={
                "source": "privileged_teacher_render",
                "student_trajectory_id": trajectory.trajectory_id,
            },
        )
