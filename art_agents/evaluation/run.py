"""`evaluate`: the same rollout function on the same held-out scenarios for several models, compared in pairs.

The rollout users already train with (`rollout(model, scenario) -> Trajectory`) runs unchanged against steps of
ours and any OpenAI-compatible or LiteLLM model (see `art_agents.evaluation.targets`); each scenario's reward is the mean
of its rollouts, and models are compared on the scenarios both ran, with a paired bootstrap interval
(`art_agents.evaluation.comparison`). Results are saved under the run folder as they finish (`art_agents.evaluation.files`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from art_agents.capture import overriding_requests
from art_agents.evaluation.comparison import compare_pair, mean_ci
from art_agents.evaluation.files import (
    EvalSummary,
    ModelSummary,
    ScenarioRun,
    append_run,
    eval_folder,
    finite_or_none,
    read_runs,
    write_summary,
)
from art_agents.evaluation.targets import EvalTarget, ModelSpec, cost_usd, resolve_targets
from art_agents.fatal import fatal_error
from art_agents.model import Model, TrainableModel
from art_agents.names import check_safe_name
from art_agents.progress import progress_bar
from art_agents.schema import Schema
from art_agents.tasks import gather_or_cancel, retry
from art_agents.trajectory import Trajectory

Decoding = Literal["rollout", "greedy", "sampled"]
# What each decoding sets in every chat request: "rollout" leaves the rollout's own settings alone.
DECODING_FIELDS: dict[str, dict[str, Any]] = {
    "rollout": {},
    "greedy": {"temperature": 0.0},
    "sampled": {"temperature": 1.0},
}
DEFAULT_CONCURRENCY = 8


class Evaluation(Schema):
    """What `evaluate` returns: the summary (as saved), every scenario's runs per model, and where they lie."""

    summary: EvalSummary
    runs: dict[str, list[ScenarioRun]] = Field(description="Model -> its scenarios, in the order given.")
    folder: Path | None = Field(None, description="`<run folder>/eval/<name>/`, or None when nothing was saved.")

    def model(self, label: str) -> ModelSummary:
        return next(m for m in self.summary.models if m.model == label)

    def trajectories(self, label: str) -> list[Trajectory]:
        return [t for run in self.runs[label] for t in run.trajectories]


async def evaluate(
    rollout: Callable[[Model, Any], Awaitable[Trajectory]],
    scenarios: Sequence[Any],
    models: Sequence[ModelSpec],
    *,
    name: str = "heldout",
    out: str | Path | None = None,
    rollouts_per_scenario: int = 1,
    concurrency: int | Mapping[str, int] = DEFAULT_CONCURRENCY,
    retries: int = 0,
    retry_delay_s: float = 1.0,
    timeout_s: float | None = None,
    decoding: Decoding = "rollout",
    litellm_params: Mapping[str, Mapping[str, Any]] | None = None,
    check: bool = True,
    seed: int = 0,
    pbar_desc: str | None = "eval",
    steps_of: TrainableModel | None = None,
) -> Evaluation:
    """Run `rollout` on every scenario for every model and compare the models pairwise.

    `models`: registered TrainableModels (their latest step, pinned), `"name@STEP"`, prompted `Model`s,
    `"model@http://host/v1"` or LiteLLM names (`"openai/gpt-4.1-mini"`; `litellm_params[name]` may give its
    `api_base` and `api_key`; `steps_of` is the TrainableModel of `"name@STEP"` entries when it is not in `models`
    itself). Each is checked before anything runs (`check=False` skips the requests).
    `concurrency` bounds the rollouts running at once per provider (a dict maps provider, a URL's host or
    "art-agents" to its bound; "default" for the rest). A rollout is tried `retries` more times when it raises
    (ART's `retry`), each try bounded by `timeout_s`. `decoding="greedy"` (temperature 0) or `"sampled"`
    (temperature 1) is set in every chat request of clients the toolkit built; `"rollout"` leaves them alone.
    Saved to `<out>/eval/<name>/` (default `out`: the folder of the first TrainableModel on a LocalBackend);
    scenarios already there are not run again. A scenario whose rollouts all raise is counted as failed; an error
    every rollout would hit (`art_agents.fatal`: server down, unknown model, a judge that cannot score) stops it.
    """
    check_safe_name(name, "name")
    if rollouts_per_scenario < 1:
        raise ValueError(f"rollouts_per_scenario must be at least 1, got {rollouts_per_scenario}")
    if decoding not in DECODING_FIELDS:
        raise ValueError(f"decoding must be one of {', '.join(DECODING_FIELDS)}, got {decoding!r}")
    ids = scenario_ids(scenarios)
    targets = await resolve_targets(models, litellm_params or {}, steps_of, check=check)
    folder = _folder(out, targets, name)
    done = {t.label: read_runs(folder / f"{t.file_stem}.jsonl") if folder else {} for t in targets}
    limits = _limits(concurrency, targets)
    call = _attempts(rollout, retries, retry_delay_s, timeout_s)
    todo = [
        (t, i, sid)
        for t in targets
        for i, sid in enumerate(ids)
        if (r := done[t.label].get(sid)) is None or not r.rewards
    ]
    bar = progress_bar(pbar_desc or "", unit="rollout", total=len(todo) * rollouts_per_scenario, show=bool(pbar_desc))

    async def run(target: EvalTarget, index: int, sid: str) -> None:
        fields = {**target.fields, **DECODING_FIELDS[decoding]}
        tries = [
            _one(call, target, scenarios[index], limits[target.provider], fields, bar)
            for _ in range(rollouts_per_scenario)
        ]
        result = _scenario_run(target, index, sid, await gather_or_cancel(tries))
        done[target.label][sid] = result
        if folder is not None:
            append_run(folder / f"{target.file_stem}.jsonl", result)

    try:
        await gather_or_cancel(run(*job) for job in todo)
    finally:
        bar.close()
    runs = {t.label: [done[t.label][sid] for sid in ids if sid in done[t.label]] for t in targets}
    summary = summarize(name, targets, runs, len(ids), rollouts_per_scenario, decoding, seed)
    if folder is not None:
        write_summary(folder, summary)
    return Evaluation(summary=summary, runs=runs, folder=folder)


class PeriodicEvaluation:
    """`train_loop(eval_every=N)`: every evaluated step so far (run once each: their files are kept) beside
    `models`, so the summary compares every evaluated step and the report marks them on the training curve."""

    def __init__(
        self,
        model: TrainableModel,
        rollout: Callable[[Model, Any], Awaitable[Trajectory]],
        scenarios: Sequence[Any],
        models: Sequence[ModelSpec] = (),
        name: str = "heldout",
    ) -> None:
        self.model, self.rollout, self.scenarios, self.models, self.name = model, rollout, scenarios, models, name
        self.steps: list[int] = []

    async def __call__(self, step: int) -> Evaluation:
        if step not in self.steps:
            self.steps.append(step)
        steps = [f"{self.model.name}@{s}" for s in self.steps]
        return await evaluate(
            self.rollout, self.scenarios, [*steps, *self.models], name=self.name, steps_of=self.model, pbar_desc=None
        )


def scenario_ids(scenarios: Sequence[Any]) -> list[str]:
    """Each scenario's `id` (a dict key or an attribute), else a hash of its JSON: the key a rerun resumes by."""
    ids = []
    for scenario in scenarios:
        given = scenario.get("id") if isinstance(scenario, Mapping) else getattr(scenario, "id", None)
        if given is None:
            dumped = scenario.model_dump(mode="json") if isinstance(scenario, Schema) else scenario
            given = hashlib.sha256(json.dumps(dumped, sort_keys=True, default=str).encode()).hexdigest()[:16]
        ids.append(str(given))
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"scenarios must differ (or have distinct ids); repeated: {', '.join(repeated[:5])}")
    return ids


def _folder(out: str | Path | None, targets: Sequence[EvalTarget], name: str) -> Path | None:
    if out is not None:
        return eval_folder(Path(out), name)
    for target in targets:
        trained = target.trained
        art_path = getattr(trained._backend, "art_path", None) if trained is not None else None
        if trained is not None and art_path is not None:
            return eval_folder(Path(art_path) / trained.project / "models" / trained.name, name)
    return None


def _limits(concurrency: int | Mapping[str, int], targets: Sequence[EvalTarget]) -> dict[str, asyncio.Semaphore]:
    given = {"default": concurrency} if isinstance(concurrency, int) else dict(concurrency)
    fallback = given.get("default", DEFAULT_CONCURRENCY)
    bounds = {t.provider: given.get(t.provider, fallback) for t in targets}
    for provider, bound in bounds.items():
        if bound < 1:
            raise ValueError(f"concurrency for {provider!r} must be at least 1, got {bound}")
    return {provider: asyncio.Semaphore(bound) for provider, bound in bounds.items()}


RolloutCall = Callable[[Model, Any], Awaitable[Any]]


def _attempts(rollout: RolloutCall, retries: int, delay_s: float, timeout_s: float | None) -> RolloutCall:
    """The rollout bounded by `timeout_s` per try and tried `retries` more times when it raises."""
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")

    async def bounded(model: Model, scenario: Any) -> Any:
        async with asyncio.timeout(timeout_s):
            return await rollout(model, scenario)

    return retry(max_attempts=retries + 1, delay=delay_s)(bounded) if retries else bounded


async def _one(
    call: RolloutCall, target: EvalTarget, scenario: Any, limit: asyncio.Semaphore, fields: dict[str, Any], bar: Any
) -> tuple[Trajectory | str, float]:
    """One rollout: its trajectory, or the error as 'Type: message'; and its wall seconds."""
    async with limit:
        started = time.perf_counter()
        try:
            with overriding_requests(fields):
                result = await call(target.model, scenario)
            if not isinstance(result, Trajectory):
                raise TypeError(f"the rollout returned {type(result).__name__}, not a Trajectory")
        except Exception as exc:
            fatal = fatal_error(exc)  # every rollout would hit it: stop rather than record it as the model's failure
            if fatal is not None:
                raise fatal from fatal.__cause__
            result = f"{type(exc).__name__}: {exc}".strip()
        finally:
            bar.update(1)
        return result, time.perf_counter() - started


def _scenario_run(target: EvalTarget, index: int, sid: str, tries: list[tuple[Trajectory | str, float]]) -> ScenarioRun:
    trajectories = [t for t, _ in tries if isinstance(t, Trajectory)]
    for trajectory in trajectories:
        trajectory.metadata.update(scenario_id=sid, evaluated_model=target.label)
    usage = [turn.usage or {} for t in trajectories for turn in t.turns]
    prompt = sum(int(u.get("prompt_tokens") or 0) for u in usage)
    completion = sum(int(u.get("completion_tokens") or 0) for u in usage)
    names = {k for t in trajectories for k in t.metrics}
    return ScenarioRun(
        scenario_id=sid,
        index=index,
        rewards=[t.reward for t in trajectories],
        errors=[e for e, _ in tries if isinstance(e, str)],
        metrics={k: statistics.fmean(float(t.metrics[k]) for t in trajectories if k in t.metrics) for k in names},
        prompt_tokens=prompt,
        completion_tokens=completion,
        latency_s=statistics.fmean(s for _, s in tries),
        cost_usd=cost_usd(target.price_model, prompt, completion),
        trajectories=trajectories,
    )


def summarize(
    name: str,
    targets: Sequence[EvalTarget],
    runs: Mapping[str, list[ScenarioRun]],
    scenarios: int,
    rollouts_per_scenario: int,
    decoding: str,
    seed: int = 0,
) -> EvalSummary:
    """Each model's means and interval over the scenarios it ran, and each pair compared on the ones both ran."""
    rewards = {label: {r.scenario_id: r.reward for r in rs} for label, rs in runs.items()}
    models = [_model_summary(t, runs[t.label], seed) for t in targets]
    labels = [t.label for t in targets]
    comparisons = [
        compare_pair(labels[j], labels[i], rewards[labels[j]], rewards[labels[i]], seed=seed)
        for j in range(len(labels))
        for i in range(j)
    ]
    return EvalSummary(
        name=name,
        scenarios=scenarios,
        rollouts_per_scenario=rollouts_per_scenario,
        decoding=decoding,
        models=models,
        comparisons=comparisons,
    )


def _model_summary(target: EvalTarget, runs: list[ScenarioRun], seed: int) -> ModelSummary:
    finished = [r for r in runs if r.reward is not None]
    mean, low, high = mean_ci([r.reward for r in finished if r.reward is not None], seed=seed)
    names = {k for r in finished for k in r.metrics}
    costs = [r.cost_usd for r in runs]
    errors = [e for r in runs for e in r.errors]
    return ModelSummary(
        model=target.label,
        file=f"{target.file_stem}.jsonl",
        step=target.step,
        scenarios=len(runs),
        failed_scenarios=len(runs) - len(finished),
        failed_rollouts=len(errors),
        mean_reward=finite_or_none(mean),
        ci_low=finite_or_none(low),
        ci_high=finite_or_none(high),
        metrics={k: statistics.fmean(r.metrics[k] for r in finished if k in r.metrics) for k in names},
        prompt_tokens=sum(r.prompt_tokens for r in runs),
        completion_tokens=sum(r.completion_tokens for r in runs),
        latency_s=statistics.fmean(r.latency_s for r in runs) if runs else 0.0,
        cost_usd=None if any(c is None for c in costs) or not costs else sum(c for c in costs if c is not None),
        first_error=errors[0] if errors else None,
    )
