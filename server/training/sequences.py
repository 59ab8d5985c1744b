"""Training sequences from trajectory groups, built on the tokens the server actually sampled.

A turn's prompt and completion ids come from the token store (keyed by the completion id the server
answered), so the trainer sees exactly what the sampler saw; only a turn without a completion id is
re-tokenized through the chat template, and that is counted. Turns merge by tokens, not by messages:
a turn whose prompt ids start with an earlier sequence's ids (its prompt + completion) joins that
sequence, the new tool/user tokens in between masked out. Anything else (a history rewritten or
summarised between calls, a re-tokenization that differs from what was sampled) starts a sequence of
its own. Only sampled assistant tokens train.

Only this model's turns train: a turn answered by another model (a judge, a helper on another
provider, recognised by its `model` field) stays in the history as context and is counted as
foreign. A stored turn sampled more than `max_staleness` steps ago is refused by name, since its
importance ratio would silently be 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from art_agents.server.models.chat_format import oversized, render_ids, render_prompt_ids
from art_agents.trajectory import TrajectoryGroup, Turn

if TYPE_CHECKING:
    from art_agents.server.storage.token_store import TokenStore
    from art_agents.trajectory import Trajectory


class TrainingInputError(ValueError):
    """Groups that cannot be trained on; the message names the group, trajectory or completion id."""


@dataclass
class TrainSequence:
    """One forward pass worth of tokens: `mask[i]` says whether `token_ids[i]` was sampled and trains.

    `sampler_logprobs[i]` is the sampler's logprob of token i (NaN where unknown: prompts and
    re-tokenized turns), for the drift metric and truncated importance sampling. `temperatures[i]`
    is the temperature token i was sampled at (1 for prompt and re-tokenized tokens).
    `trajectory_tokens` counts the trained tokens of the whole trajectory, over all its sequences:
    the loss weighs trajectories, so splitting one into several sequences must not change its weight.
    """

    token_ids: list[int]
    mask: list[bool]
    sampler_logprobs: list[float]
    temperatures: list[float] = field(default_factory=list)
    advantage: float = 0.0
    group: int = 0
    trajectory: int = 0
    trajectory_tokens: int = 0
    completion_ids: list[str | None] = field(default_factory=list)

    @property
    def trained_tokens(self) -> int:
        return sum(self.mask)

    def extend(
        self, prompt_ids: list[int], completion: list[int], logprobs: list[float], temperature: float = 1.0
    ) -> None:
        """Append a turn whose prompt starts with this sequence's tokens (the new prompt part is masked)."""
        extra = prompt_ids[len(self.token_ids) :]
        self.token_ids += extra + completion
        self.mask += [False] * len(extra) + [True] * len(completion)
        self.sampler_logprobs += [math.nan] * len(extra) + logprobs
        self.temperatures += [1.0] * len(extra) + [temperature] * len(completion)


@dataclass
class BuildStats:
    turns_from_store: int = 0
    turns_retokenized: int = 0
    turns_foreign: int = 0
    turns_truncated: int = 0
    # trajectories with no model turn (replies written in by hand, say): their reward counts in the group's
    # baseline, but nothing of theirs trains
    trajectories_without_turns: int = 0
    staleness: dict[int, int] = field(default_factory=dict)  # steps behind -> stored turns

    def as_metrics(self) -> dict[str, float]:
        metrics = {
            "turns_from_store": float(self.turns_from_store),
            "turns_retokenized": float(self.turns_retokenized),
            "turns_foreign": float(self.turns_foreign),
        }
        if self.turns_truncated:
            metrics["turns_truncated"] = float(self.turns_truncated)
        if self.trajectories_without_turns:
            metrics["trajectories_without_turns"] = float(self.trajectories_without_turns)
        metrics.update({f"turns_staleness_{k}": float(n) for k, n in sorted(self.staleness.items())})
        return metrics


@dataclass(frozen=True)
class Policy:
    """The model being trained: whose turns count, at which step, how stale a sample may be, and how long a
    sequence its context holds (`token_bytes`: the most bytes one token stands for; `truncate`: cut, not refuse)."""

    name: str
    step: int
    max_staleness: int = 0
    context_tokens: int | None = None
    token_bytes: int = 1
    truncate: bool = False

    def owns(self, turn: Turn) -> bool:
        """False for a turn another model answered (`model` names someone else); unnamed turns are ours."""
        return turn.model is None or turn.model.split("@", 1)[0] == self.name


@dataclass
class _TurnTokens:
    prompt_ids: list[int]
    completion: list[int]
    logprobs: list[float]
    completion_id: str | None
    temperature: float = 1.0


def build_sequences(
    groups: list[TrajectoryGroup],
    store: TokenStore,
    tokenizer: Any,
    advantages: dict[tuple[int, int], float] | None = None,
    only_groups: set[int] | None = None,
    policy: Policy | None = None,
) -> tuple[list[TrainSequence], BuildStats]:
    """Sequences for every trajectory of `groups` (or of `only_groups`), each with its advantage.

    `advantages` maps (group index, trajectory index) to the trajectory's advantage; every sequence of
    a trajectory shares it, and a trajectory without one is left out. With a `policy`, other models' turns are left out (counted) and stale
    stored turns are refused. Every completion id of the trained turns is checked against the store
    first, so a bad id fails the whole call before any training.
    """
    chosen = [(g, group) for g, group in enumerate(groups) if only_groups is None or g in only_groups]
    ours = {
        (g, t): [turn for turn in trajectory.turns if policy is None or policy.owns(turn)]
        for g, group in chosen
        for t, trajectory in enumerate(group.trajectories)
    }
    stats = BuildStats(
        turns_foreign=sum(len(t.turns) for _, g in chosen for t in g.trajectories) - sum(map(len, ours.values())),
        trajectories_without_turns=sum(not t.turns for _, g in chosen for t in g.trajectories),
    )
    records = _stored(store, [turn.completion_id for turns in ours.values() for turn in turns])
    if policy is not None:
        _check_staleness(records, policy, stats)
    sequences: list[TrainSequence] = []
    for g, group in chosen:
        for t, trajectory in enumerate(group.trajectories):
            if advantages is not None and (g, t) not in advantages:
                continue  # in a group kept for another trajectory's hint (self-distillation)
            advantage = 0.0 if advantages is None else advantages[(g, t)]
            turns = [_turn_tokens(trajectory, turn, records, tokenizer, stats, policy) for turn in ours[(g, t)]]
            merged = merge_turns([turn for turn in turns if turn is not None])
            total = sum(s.trained_tokens for s in merged)
            for sequence in merged:
                sequence.advantage, sequence.group, sequence.trajectory = advantage, g, t
                sequence.trajectory_tokens = total
                sequences.append(sequence)
    if policy is not None and not sequences and stats.turns_foreign:
        raise TrainingInputError(
            f"every turn of these groups was answered by another model ({stats.turns_foreign} turns), none by "
            f"{policy.name!r}; record the rollouts with this model's client (model.openai_client())"
        )
    return sequences, stats


def sft_sequences(
    trajectories: list[Trajectory], store: TokenStore, tokenizer: Any, policy: Policy, last_only: bool = False
) -> tuple[list[TrainSequence], BuildStats]:
    """Sequences whose trained tokens are the assistant replies of `trajectories` (sequence.trajectory is the index).

    Every assistant message trains (or each trajectory's last, `last_only`) except those marked `"weight": 0`, as
    in OpenAI's fine-tuning format: worked examples in a prompt are context, not the demonstration. One this
    server sampled for `policy` (its completion id is in `store`) trains on its stored tokens, any other (a
    teacher's, a file's) is re-tokenized through the chat template with the history's tools. Non-assistant tokens
    are masked as in RL.
    """
    ids = [turn.completion_id for trajectory in trajectories for turn in trajectory.turns if policy.owns(turn)]
    stored = set(store.get_many([cid for cid in ids if cid is not None]))
    demonstrations = []
    for t, trajectory in enumerate(trajectories):
        turns = _assistant_turns(trajectory, policy, stored)
        if not turns:
            raise TrainingInputError(
                f"trajectories[{t}] (id {trajectory.id!r}) has no assistant message to learn from (none, or all "
                "marked weight 0); add the reply to imitate as the last message, or drop the trajectory"
            )
        demonstrations.append(trajectory.model_copy(update={"turns": turns[-1:] if last_only else turns}))
    return build_sequences([TrajectoryGroup(demonstrations)], store, tokenizer, policy=policy)


def _assistant_turns(trajectory: Trajectory, policy: Policy, stored: set[str]) -> list[Turn]:
    """A turn per assistant message not marked weight 0: the recorded one where this policy sampled it, else one
    to re-tokenize."""
    sampled = {(t.history, t.index): t for t in trajectory.turns if t.completion_id in stored and policy.owns(t)}
    return [
        sampled.get((h, i), Turn(history=h, index=i))
        for h, history in enumerate(trajectory.histories())
        for i, message in enumerate(history.messages)
        if message.role == "assistant" and message.weight != 0
    ]


def _stored(store: TokenStore, ids: list[str | None]) -> dict[str, Any]:
    """The token records of `ids`, or a TrainingInputError naming the ones this store does not hold."""
    known = [cid for cid in ids if cid is not None]
    records = store.get_many(known)
    missing = [cid for cid in dict.fromkeys(known) if cid not in records]
    if missing:
        raise TrainingInputError(
            f"completion id(s) {listed([repr(cid) for cid in missing])} are not in this model's token store; train only on completions this server "
            "sampled for this model (or clear turn.completion_id to have the turn re-tokenized)"
        )
    return records


def check_unique_completions(groups: list[TrajectoryGroup]) -> None:
    """A completion trains once per call: an id in two turns (a trajectory sent twice, say) is refused by name."""
    seen: dict[str, str] = {}
    repeated: list[str] = []
    for g, group in enumerate(groups):
        for t, trajectory in enumerate(group.trajectories):
            where = f"groups[{g}].trajectories[{t}] (id {trajectory.id!r})"
            for cid in (turn.completion_id for turn in trajectory.turns if turn.completion_id is not None):
                if cid in seen:
                    repeated.append(f"{cid!r} in {seen[cid]} and {where}")
                else:
                    seen[cid] = where
    if repeated:
        raise TrainingInputError(
            f"completion id(s) appear more than once in this train call: {listed(repeated)}; each completion trains "
            "once per call: drop the duplicate trajectories or turns"
        )


def listed(items: list[str], limit: int = 5) -> str:
    """The first `limit` items, comma-separated, and how many more there are."""
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _check_staleness(records: dict[str, Any], policy: Policy, stats: BuildStats) -> None:
    stale = []
    for cid, record in records.items():
        behind = policy.step - record.policy_step
        stats.staleness[behind] = stats.staleness.get(behind, 0) + 1
        if behind > policy.max_staleness:
            stale.append(f"{cid!r} (sampled at step {record.policy_step})")
    if stale:
        raise TrainingInputError(
            f"{len(stale)} turn(s) were sampled more than max_staleness={policy.max_staleness} steps before the "
            f"current step {policy.step}: {listed(stale)}. Their importance ratio would be 1, training another policy "
            "as if it were this one; train on fresh rollouts, or raise TrainConfig.max_staleness to accept them"
        )


def merge_turns(turns: list[_TurnTokens]) -> list[TrainSequence]:
    """Merge each turn into the most recent sequence its prompt extends, else start a new one.

    Searching all open sequences (newest first), not just the last, keeps interleaved histories of
    one rollout (two agents taking turns) merged per history.
    """
    sequences: list[TrainSequence] = []
    for turn in turns:
        target = next((s for s in reversed(sequences) if _starts_with(turn.prompt_ids, s.token_ids)), None)
        if target is None:
            target = TrainSequence(token_ids=[], mask=[], sampler_logprobs=[])
            sequences.append(target)
        target.extend(turn.prompt_ids, turn.completion, turn.logprobs, turn.temperature)
        target.completion_ids.append(turn.completion_id)
    return sequences


def _starts_with(ids: list[int], prefix: list[int]) -> bool:
    return len(ids) >= len(prefix) and ids[: len(prefix)] == prefix


def _turn_tokens(
    trajectory: Trajectory,
    turn: Turn,
    records: dict[str, Any],
    tokenizer: Any,
    stats: BuildStats,
    policy: Policy | None,
) -> _TurnTokens | None:
    """The turn's tokens, checked against the context; None for a turn truncated to nothing."""
    context = None if policy is None else policy.context_tokens
    if turn.completion_id is not None:
        record = records[turn.completion_id]
        stats.turns_from_store += 1
        tokens = _TurnTokens(
            list(record.prompt_ids),
            list(record.completion_ids),
            list(record.logprobs),
            turn.completion_id,
            record.temperature,
        )
    else:
        stats.turns_retokenized += 1
        prompt = [m.wire() for m in trajectory.histories()[turn.history].messages[: turn.index]]
        if policy is not None and (size := oversized(prompt, context, policy.token_bytes)) is not None:
            return _over_context(trajectory, turn, f"its prompt is {size} bytes", policy, stats)
        tokens = _retokenize(trajectory, turn, tokenizer)
    length = len(tokens.prompt_ids) + len(tokens.completion)  # the merged sequence's length through this turn
    if policy is None or context is None or length <= context:
        return tokens
    _over_context(trajectory, turn, f"its sequence is {length} tokens", policy, stats)
    keep = context - len(tokens.prompt_ids)
    if keep <= 0:
        return None
    return _TurnTokens(
        tokens.prompt_ids, tokens.completion[:keep], tokens.logprobs[:keep], tokens.completion_id, tokens.temperature
    )


def _over_context(trajectory: Trajectory, turn: Turn, size: str, policy: Policy, stats: BuildStats) -> None:
    """Refuse a turn longer than the context, naming it, or (when asked) count it as truncated."""
    if not policy.truncate:
        raise TrainingInputError(
            f"trajectory {trajectory.id!r}, turn at history {turn.history} message {turn.index}: {size}, over the "
            f"model's context of {policy.context_tokens} tokens; shorten the conversation, or pass "
            "truncate_to_context=True in the train config to train on the part that fits"
        )
    stats.turns_truncated += 1


def _retokenize(trajectory: Trajectory, turn: Turn, tokenizer: Any) -> _TurnTokens:
    """Render the turn through the chat template: the request with a generation prompt, then with the response.

    The completion is what the response adds; when the template rewrites earlier text once the
    response is present (so the prompt is not a prefix), the shared prefix is the prompt. Tokens the
    template appends after the end-of-turn token (a newline) are not trained: a sampler stops there.
    """
    history = trajectory.histories()[turn.history]
    messages = [m.wire() for m in history.messages]
    try:
        prompt = render_prompt_ids(tokenizer, messages[: turn.index], history.tools)
        full = render_ids(tokenizer, messages[: turn.index + 1], history.tools, add_generation_prompt=False)
    except Exception as exc:  # the template's own checks (Jinja raise_exception) reject these messages
        raise TrainingInputError(
            f"trajectory {trajectory.id}: the chat template cannot render turn at history {turn.history} message "
            f"{turn.index} ({type(exc).__name__}: {exc}); fix the messages or record the turn with its completion id"
        ) from exc
    shared = _common_prefix(prompt, full)
    completion = full[shared:]
    end = tokenizer.eos_token_id
    if end is not None and end in completion:
        completion = completion[: len(completion) - completion[::-1].index(end)]
    if not completion:
        raise TrainingInputError(
            f"trajectory {trajectory.id}: turn at history {turn.history} message {turn.index} renders to no "
            "completion tokens through the chat template; give it a completion_id or non-empty content"
        )
    return _TurnTokens(full[:shared], completion, [math.nan] * len(completion), None)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def check_groups(groups: list[TrajectoryGroup]) -> None:
    """Refuses a train call without groups, with an empty group, or without model turns to train on."""
    if not groups:
        raise TrainingInputError("no trajectory groups to train on; pass at least one group")
    for g, group in enumerate(groups):
        if not group.trajectories:
            raise TrainingInputError(f"groups[{g}] has no trajectories; drop empty groups before training")
        if not any(t.turns for t in group.trajectories):
            raise TrainingInputError(
                f"groups[{g}] has no model turns to train on; record rollouts with the client's openai_client() "
                "(or set Trajectory.turns) so the server can find the sampled tokens"
            )
