"""What `art.evaluate` runs a rollout against: each entry of `models=[...]` made into one `EvalTarget`.

An entry is a `TrainableModel` (its latest step), `"name@12"` (a step of a TrainableModel also given), a prompted
`Model` (any OpenAI-compatible endpoint), `"llama3.2@http://localhost:11434/v1"` (a model at a URL: vLLM, Ollama)
or a LiteLLM name (`"openai/gpt-4.1-mini"`, `"groq/llama-3.1-8b-instant"`) whose provider speaks the OpenAI API.
Every target is pinned: a step of ours is `name@N` for the whole evaluation, even while training goes on, and the
rollout is given a prompted `Model` whose requests name it (see `capture.overriding_requests`).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from art_agents.errors import SetupError
from art_agents.model import Model, TrainableModel

ModelSpec = Model | str
OURS = "art-agents"  # the concurrency group of our own server's steps
_STEP = re.compile(r"^(?P<name>[^@/]+)@(?P<step>\d+)$")
_AT_URL = re.compile(r"^(?P<name>[^@]+)@(?P<url>https?://\S+)$")
OPENAI_URL = "https://api.openai.com/v1"


@dataclass
class EvalTarget:
    """One model under evaluation: the name its results are filed under and what the rollout is given."""

    label: str = field(metadata={"doc": "`name@step` for ours; the entry as given for the others."})
    model: Model
    provider: str = field(metadata={"doc": "Concurrency group: art-agents, a LiteLLM provider, or a URL's host."})
    fields: dict[str, Any] = field(default_factory=dict)  # set in every chat request the rollout makes
    price_model: str | None = None  # LiteLLM's name for pricing; None: no price (our own steps)
    trained: TrainableModel | None = None
    step: int | None = None

    @property
    def file_stem(self) -> str:
        """The label as a file name: `openai/gpt-4.1-mini` -> `openai__gpt-4.1-mini`."""
        return re.sub(r"[^A-Za-z0-9._@=-]+", "_", self.label.replace("/", "__")).strip("_")


async def resolve_targets(
    models: Sequence[ModelSpec],
    litellm_params: Mapping[str, Mapping[str, Any]],
    steps_of: TrainableModel | None = None,
    *,
    check: bool = True,
) -> list[EvalTarget]:
    """Every entry of `models` as a target, or one SetupError listing every problem: each entry that cannot be one
    and (with `check`) each target that cannot be reached. `"name@N"` names a step of a TrainableModel in `models`
    or of `steps_of`."""
    if not models:
        raise SetupError("evaluate needs at least one model in models=[...]")
    given = [*models, steps_of] if steps_of is not None else models
    trainables = {m.name: m for m in given if isinstance(m, TrainableModel)}
    problems: list[str] = []
    targets: list[EvalTarget] = []
    for entry in models:
        try:
            targets.append(await _target(entry, trainables, litellm_params.get(str(entry), {})))
        except SetupError as exc:
            problems.append(str(exc))
    labels = [t.label for t in targets]
    problems += [f"{label!r} is given twice" for label in sorted({x for x in labels if labels.count(x) > 1})]
    if check:
        problems += await reachability_problems(targets)
    if problems:
        raise SetupError("; ".join(problems))
    return targets


async def _target(entry: ModelSpec, trainables: Mapping[str, TrainableModel], params: Mapping[str, Any]) -> EvalTarget:
    if isinstance(entry, TrainableModel):
        return _step_of(entry, await entry.get_step())
    if isinstance(entry, Model):
        base_url, _ = entry.endpoint()
        return EvalTarget(entry.name, entry, _host(base_url), price_model=entry.served_name)
    if not isinstance(entry, str) or not entry.strip():
        raise SetupError(f"models: {entry!r} is neither a Model nor a model name")
    if match := _STEP.match(entry):
        trained = trainables.get(match["name"])
        if trained is None:
            raise SetupError(
                f"{entry!r}: no TrainableModel named {match['name']!r} is in models=[...]; pass the registered model too"
            )
        return _step_of(trained, int(match["step"]))
    if entry in trainables:
        return _step_of(trainables[entry], await trainables[entry].get_step())
    if match := _AT_URL.match(entry):
        model = Model(name=match["name"], inference_base_url=match["url"], inference_api_key=params.get("api_key"))
        return EvalTarget(entry, model, _host(match["url"]), price_model=None)
    if "/" in entry:
        return _litellm_target(entry, params)
    raise SetupError(
        f"{entry!r} is not a model evaluate knows: give a registered TrainableModel, 'name@STEP' of one, "
        "'provider/model' (LiteLLM), 'model@http://host/v1' or an art_agents.Model"
    )


def _step_of(trained: TrainableModel, step: int) -> EvalTarget:
    served = trained.get_inference_name(step)
    base_url, api_key = trained.endpoint()
    pinned = Model(
        name=trained.name,
        project=trained.project,
        config=trained.config,
        inference_base_url=base_url,
        inference_api_key=api_key,
        inference_model_name=served,
    )
    return EvalTarget(served, pinned, OURS, fields={"model": served}, trained=trained, step=step)


def _litellm_target(entry: str, params: Mapping[str, Any]) -> EvalTarget:
    """A LiteLLM model name as an OpenAI-compatible endpoint, its key checked before anything runs."""
    from art_agents.extras import require_extra
    from art_agents.llm import KeyProblem, check_key, import_litellm

    require_extra("ruler", purpose=f"model {entry!r} (a LiteLLM name)")
    litellm = import_litellm()
    given = dict(params)
    try:
        name, provider, dynamic_key, api_base = litellm.get_llm_provider(model=entry, api_base=given.get("api_base"))
    except Exception as exc:
        raise SetupError(f"{entry!r}: LiteLLM does not know this provider ({exc})") from exc
    api_base = given.get("api_base") or given.get("base_url") or api_base
    if provider == "openai":
        api_base = api_base or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL
    if not api_base:
        raise SetupError(
            f"{entry!r}: provider {provider!r} has no OpenAI-compatible endpoint that a rollout's openai_client() can "
            "reach; serve it through LiteLLM's proxy and give 'model@http://proxy/v1', or pass litellm_params api_base"
        )
    try:
        checked = check_key(entry, given, option=f"litellm_params[{entry!r}]['api_key']")
    except KeyProblem as exc:
        raise SetupError(str(exc)) from exc
    api_key = checked.get("api_key") or dynamic_key or _env_key(provider)
    model = Model(name=name, inference_base_url=api_base, inference_api_key=api_key)
    return EvalTarget(entry, model, provider, price_model=entry)


def _env_key(provider: str) -> str | None:
    return os.environ.get(f"{provider.upper()}_API_KEY")


def _host(url: str) -> str:
    return urlsplit(url).netloc or url


async def reachability_problems(targets: Sequence[EvalTarget], timeout_s: float = 15.0) -> list[str]:
    """Every target whose endpoint is down, refuses its key, or lacks the step asked for, named."""
    return [p for p in await asyncio.gather(*(_problem(t, timeout_s) for t in targets)) if p]


async def _problem(target: EvalTarget, timeout_s: float) -> str | None:
    import httpx

    base_url, api_key = target.model.endpoint()
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(
                f"{base_url.rstrip('/')}/models", headers={"Authorization": f"Bearer {api_key}"}
            )
    except httpx.HTTPError as exc:
        return f"{target.label!r} is unreachable at {base_url} ({type(exc).__name__}: {exc}); start it or fix the URL"
    if response.status_code in (401, 403):
        return f"{target.label!r} refused the API key at {base_url} ({response.status_code}); pass the right key"
    if target.trained is not None and target.step is not None:
        steps = {c.step for c in await target.trained.backend.list_checkpoints(target.trained)}
        current = await target.trained.get_step()
        if target.step not in steps | {current}:
            return f"{target.label!r}: {target.trained.name} has no checkpoint {target.step} (it has {sorted(steps)})"
    return None


def cost_usd(price_model: str | None, prompt_tokens: int, completion_tokens: int) -> float | None:
    """LiteLLM's price of the tokens, or None where it has none (our own steps, local models)."""
    if price_model is None:
        return None
    try:
        from art_agents.llm import import_litellm

        prompt, completion = import_litellm().cost_per_token(
            model=price_model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
    except Exception:  # not installed, or a model missing from LiteLLM's price map: the cost is unknown
        return None
    return float(prompt) + float(completion)
