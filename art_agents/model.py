"""Models: a prompted baseline anywhere, and a trainable LoRA on an art-agents server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)

from art_agents import parts
from art_agents.art.arguments import model_config_updates, model_keywords
from art_agents.errors import ArtError, SetupError
from art_agents.names import check_safe_name
from art_agents.report.reporters import create_reporters, reporter_names
from art_agents.schema import Schema
from art_agents.sft_config import TrainSFTConfig
from art_agents.train_config import ModelConfig, TrainConfig
from art_agents.trajectory import RolloutException, Trajectory, TrajectoryGroup
from art_agents.wire import LogResult, TrainResult, TrainSFTResult

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI
    from openai import AsyncOpenAI, OpenAI

    from art_agents.backends.protocol import Backend
    from art_agents.report.reporters import Reporter


class Model(Schema):
    """A model behind any OpenAI-compatible endpoint, e.g. a prompted baseline for comparison.

    Rollout code takes a `Model` and calls `openai_client()`; the same code then runs against a
    `TrainableModel`, and every call it makes inside a rollout is captured.

    ART's keyword arguments are accepted too: `config` (your own pydantic settings, carried as is),
    `entity`, `id`, `run_id` and `run_name` (W&B run names: ignored; files and serving follow `name`), `trainable`
    (must match the class), `base_path` (only ".art": the files go where the backend's path says) and
    `report_metrics` (ART's name for `report_to`).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    project: str = "default"
    config: Any = Field(None, description="Your own settings for rollouts (ART's `config`), carried as given.")
    inference_base_url: str | None = None
    inference_api_key: str | None = None
    inference_model_name: str | None = Field(None, description="Model name sent to the endpoint; defaults to `name`.")
    report_to: list[str] | None = Field(
        None,
        description="Where train and log steps go besides history.jsonl: 'wandb', 'langfuse', 'openpipe', or "
        "['none']. None reads ART_AGENTS_REPORT_TO (comma separated) and adds langfuse when LANGFUSE_PUBLIC_KEY and "
        "LANGFUSE_SECRET_KEY are set, openpipe when OPENPIPE_API_KEY is (see art_agents.report.reporters).",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _art_keywords(cls, data: Any, handler: ModelWrapValidatorHandler[Model]) -> Model:
        """ART's keyword arguments become ours first (`art_agents.art.arguments`, the one place that knows them)."""
        if not isinstance(data, dict):
            return handler(data)
        data, server_updates = model_keywords(data, trainable=issubclass(cls, TrainableModel), owner=cls.__name__)
        model = handler(data)
        if server_updates and isinstance(model, TrainableModel):  # only a TrainableModel is given any
            model._update_server_config(server_updates)
        return model

    @property
    def trainable(self) -> bool:
        """False for a prompted model, True for a TrainableModel (as ART's `trainable`)."""
        return False

    @overload
    def openai_client(self, *, sync: Literal[False] = False, **kwargs: Any) -> AsyncOpenAI: ...
    @overload
    def openai_client(self, *, sync: Literal[True], **kwargs: Any) -> OpenAI: ...
    def openai_client(self, *, sync: bool = False, **kwargs: Any) -> AsyncOpenAI | OpenAI:
        """An OpenAI SDK client whose chat completions are captured inside rollouts."""
        import httpx
        import openai

        from art_agents.backends.transport import CaptureAsyncTransport, CaptureTransport

        base_url, api_key = self.endpoint()
        if sync:
            return openai.OpenAI(
                base_url=base_url, api_key=api_key, http_client=httpx.Client(transport=CaptureTransport()), **kwargs
            )
        http_client = httpx.AsyncClient(transport=CaptureAsyncTransport())
        return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, **kwargs)

    def chat_model(self, **kwargs: Any) -> ChatOpenAI:
        """A LangChain `ChatOpenAI` for this model, captured inside rollouts (needs the `langgraph` extra)."""
        return parts.load(parts.CHAT_MODEL)(self, **kwargs)  # type: ignore[no-any-return]

    def litellm_completion_params(self, step: int | None = None) -> dict[str, Any]:
        """Keyword arguments for `litellm.acompletion(**params, messages=...)` that reach this model (at `step`).

        As ART's: the model name with a provider prefix (`openai/`: the server speaks the OpenAI API), the
        endpoint as `base_url` (and `api_base`, litellm's older name) and the API key. The server samples at
        temperature 1.0 unless told otherwise, so no temperature is added (pass your own).
        """
        base_url, api_key = self.endpoint()
        model = f"openai/{self.get_inference_name(step)}"
        return {"model": model, "base_url": base_url, "api_base": base_url, "api_key": api_key}

    def get_inference_name(self, step: int | None = None) -> str:
        """The `model` to send to the chat API: the served name (its latest step), or `name@step` for a checkpoint."""
        return self.served_name if step is None else f"{self.served_name}@{step}"

    @property
    def served_name(self) -> str:
        return self.inference_model_name or self.name

    async def log(
        self,
        trajectories: Iterable[TrajectoryGroup] | Iterable[Trajectory | BaseException] | None = None,
        split: str = "val",
        *,
        metrics: dict[str, float] | None = None,
        step: int | None = None,
    ) -> LogResult:
        """Record an evaluation (ART's `model.log`); only a registered TrainableModel has a server to record it."""
        raise ArtError(
            f"model {self.name!r} is a prompted Model: log() records evaluations in the server folder of a "
            "registered TrainableModel; score a baseline's groups yourself (`write_groups` saves them)"
        )

    async def rollout_base_url(self) -> str:
        """A base URL (`<server>/r/<rollout id>/v1`) whose every call is recorded for the current rollout.

        For an agent in another process or language: give it this URL and `endpoint()`'s key. The server keeps
        each call it answers there, in any protocol (Chat Completions, Responses, Anthropic Messages,
        Completions), and the trajectory gets them when the `art.rollout()` scope ends; the URL then takes no
        more calls. Only an art-agents server offers it.
        """
        from art_agents.backends.server_capture import open_scoped
        from art_agents.capture import current_trajectory

        trajectory = current_trajectory()
        if trajectory is None:
            raise SetupError("rollout_base_url() is for inside a rollout; call it within `async with art.rollout():`")
        base_url, api_key = self.endpoint()
        if not base_url.rstrip("/").endswith("/v1"):
            raise SetupError(f"{base_url} is not an art-agents server's /v1 URL, so it has no rollout-scoped URLs")
        return await open_scoped(trajectory, base_url.rstrip("/").removesuffix("/v1"), api_key)

    def endpoint(self) -> tuple[str, str]:
        """(base URL, API key) of the model's OpenAI-compatible server, for clients built elsewhere."""
        if self.inference_base_url is None:
            if self.trainable:
                raise _not_registered(self.name)
            raise SetupError(f"model {self.name!r} has no inference_base_url; set it to its OpenAI-compatible URL")
        return self.inference_base_url, self.inference_api_key or "art-agents"


class TrainableModel(Model):
    """A LoRA on `base_model` (a hub id or a local folder) that an art-agents server serves and trains.

    `config` is the `ModelConfig` the server loads it with. ART code that passes its own settings as `config`
    keeps them there (`model.config.max_turns` works) and the server gets `ModelConfig()`, changed by ART's
    `lora_config=` / `_internal_config=` where given: see `server_config`.
    """

    base_model: str
    config: ModelConfig | SerializeAsAny[BaseModel] = Field(default_factory=ModelConfig, union_mode="left_to_right")
    _backend: Backend | None = PrivateAttr(default=None)
    _server_config: ModelConfig | None = PrivateAttr(default=None)
    _reporters: list[Reporter] = PrivateAttr(default_factory=list)
    # ART programs may set `model._internal_config = art.dev.InternalModelConfig(...)` after construction; it is
    # read at `register` (as the keyword is at construction), so it takes effect or is refused by name.
    _internal_config: Mapping[str, Any] | None = PrivateAttr(default=None)

    @field_validator("name", "project")
    @classmethod
    def _safe_path_component(cls, value: str, info: ValidationInfo) -> str:
        return check_safe_name(value, info.field_name or "name")

    @field_validator("config", mode="before")
    @classmethod
    def _model_config(cls, value: Any) -> Any:
        """A dict (or None) is a ModelConfig, so that a misspelt setting is an error, not the user's own settings."""
        return ModelConfig.model_validate(value or {}) if value is None or isinstance(value, Mapping) else value

    def _update_server_config(self, updates: Mapping[str, Any]) -> None:
        """Change the ModelConfig sent at registration: `config` when it is one, else the one kept beside it."""
        server = ModelConfig.model_validate({**self.server_config.model_dump(), **updates})
        if isinstance(self.config, ModelConfig):
            self.config = server
        else:
            self._server_config = server

    @property
    def server_config(self) -> ModelConfig:
        """The ModelConfig sent at registration: `config` when it is one, else what ART's keywords made of the defaults."""
        if isinstance(self.config, ModelConfig):
            return self.config
        return self._server_config or ModelConfig()

    @property
    def trainable(self) -> bool:
        return True

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise _not_registered(self.name)
        return self._backend

    async def register(self, backend: Backend, _openai_client_config: Mapping[str, Any] | None = None) -> None:
        """Create (or reopen) the model on the backend and point the inference client at it.

        ART's `_openai_client_config` (vLLM server arguments) is refused unless empty: the backend picks the
        port and key (`LocalBackend(port=...)`).
        """
        if _openai_client_config:
            raise ArtError(
                f"_openai_client_config is not supported ({', '.join(_openai_client_config)}): the backend runs the "
                "server; set its port with LocalBackend(port=...) or start `art-agents serve` and use RemoteBackend"
            )
        if self._internal_config:
            try:
                self._update_server_config(model_config_updates(None, self._internal_config))
            except ValueError as exc:
                raise ArtError(f"model._internal_config: {exc}") from exc
        reporters = create_reporters(reporter_names(self.report_to), self)
        await backend.register(self)
        self._backend = backend
        self._reporters = reporters
        self.inference_base_url = f"{backend.base_url}/v1"
        self.inference_api_key = backend.api_key
        self.inference_model_name = self.name

    @property
    def reporters(self) -> list[Reporter]:
        """The reporters built at registration from `report_to` (see `art_agents.report.reporters`)."""
        return self._reporters

    async def get_step(self) -> int:
        return await self.backend.get_step(self)

    async def train(
        self,
        groups: Iterable[TrajectoryGroup],
        config: TrainConfig | None = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
        *,
        progress: bool = True,
        metrics: Mapping[str, float] | None = None,
    ) -> TrainResult:
        """One GRPO step on the groups; returns when the new checkpoint is being served.

        ART's `_config` (its `art.dev.TrainConfig` dict) is mapped onto `config` where this trainer has the
        setting and refused by name where it has not (see `art_agents.art.arguments.art_train_config`); `verbose`
        prints a line when the step starts and ends. `progress=False` hides the step's bar (which
        `art_agents.progress` draws only on a terminal). `metrics` are the caller's figures for the step's history
        row (the pipelined loop's waits and throughput).
        """
        art_options: dict[str, Any] = {"_config": _config} if _config else {}
        if verbose:
            art_options["verbose"] = True
        if metrics:
            art_options["metrics"] = dict(metrics)
        return await self.backend.train(self, list(groups), config, progress=progress, **art_options)

    async def train_sft(
        self,
        trajectories: Iterable[Trajectory],
        config: TrainSFTConfig | None = None,
        verbose: bool = False,
        *,
        progress: bool = True,
    ) -> TrainSFTResult:
        """Supervised fine-tuning (ART's `model.train_sft`): cross-entropy on the trajectories' assistant replies.

        Trains the same LoRA as `train` and commits the next step of the same lineage (`name@N+1`, a history row
        with `"kind": "sft"`). Turns this server sampled train on their stored tokens; any other reply (a
        teacher's, a file's) is tokenized with the model's chat template and tools, counted as `turns_retokenized`.
        """
        return await self.backend.train_sft(self, list(trajectories), config, progress=progress, verbose=verbose)

    async def log(
        self,
        trajectories: Iterable[TrajectoryGroup] | Iterable[Trajectory | BaseException] | None = None,
        split: str = "val",
        *,
        metrics: dict[str, float] | None = None,
        step: int | None = None,
    ) -> LogResult:
        """Record an evaluation without training (ART's `model.log`), at the served step unless `step` is given.

        Takes trajectory groups, or trajectories (and exceptions) that become one group. The server writes
        `trajectories/<split>/<step:04d>.jsonl` and a history row with `<split>/reward`, `<split>/reward_std`,
        `<split>/n` and the mean of each trajectory metric, which `delete_checkpoints(best_checkpoint_metric=...)`
        reads. `metrics` adds values to the row (a name without '/' gets the split as prefix).
        """
        groups = _as_groups(trajectories)
        return await self.backend.log(self, groups, split, metrics=metrics, step=step)

    async def delete_checkpoints(
        self, steps: list[int] | str | None = None, *, best_checkpoint_metric: str | None = None
    ) -> list[int]:
        """Delete checkpoints; returns the deleted steps. The latest is never deleted.

        - `delete_checkpoints([1, 2])`: those steps.
        - `delete_checkpoints(best_checkpoint_metric="val/reward")` (or the metric as the first argument, as ART
          takes it): keep the latest step and the step with the highest mean of that metric in history.jsonl,
          delete the rest. Refused, deleting nothing, when no checkpoint has the metric (`log` records it).
        - `delete_checkpoints()`: keep the latest, step 0 and, if any were logged, the best step by
          `val/reward`; delete the rest.
        """
        if isinstance(steps, str):
            if best_checkpoint_metric is not None:
                raise ArtError("give the metric once: positionally or as best_checkpoint_metric=")
            steps, best_checkpoint_metric = None, steps
        if best_checkpoint_metric is None:  # a Backend written before the metric existed still works
            return await self.backend.delete_checkpoints(self, steps)
        return await self.backend.delete_checkpoints(self, steps, best_checkpoint_metric=best_checkpoint_metric)

    async def export(
        self,
        to: str | Path,
        *,
        format: Literal["lora", "merged", "gguf"] = "lora",
        step: int | None = None,
        overwrite: bool = False,
        quantization: str | None = None,
    ) -> Path:
        """Write checkpoint `step` (default: the latest) to the folder `to` as `art-agents export` does: a LoRA
        folder for vLLM/SGLang, a merged transformers folder, or GGUF with an Ollama Modelfile. Returns `to`.

        Runs in this process on the checkpoints of a `LocalBackend` (they are on this disk, and its `server` extra
        has torch and PEFT); for a remote server, run `art-agents export` on its machine.
        """
        art_path = getattr(self.backend, "art_path", None)
        if art_path is None:
            raise ArtError(
                f"model.export reads the checkpoints on the server's disk, which a {type(self.backend).__name__} "
                f"does not share; run `art-agents export <art_path>/{self.project}/models/{self.name} --to DIR` "
                "on the server's machine"
            )
        export_model = parts.load(parts.EXPORT)
        model_dir = Path(art_path) / self.project / "models" / self.name
        return await asyncio.to_thread(
            export_model, model_dir, to, format=format, step=step, overwrite=overwrite, quantization=quantization
        )


def _not_registered(name: str) -> SetupError:
    return SetupError(f"model {name!r} is not registered; call `await model.register(backend)` before its rollouts")


def _as_groups(
    items: Iterable[TrajectoryGroup] | Iterable[Trajectory | BaseException] | None,
) -> list[TrajectoryGroup]:
    """ART's `log` input: groups as they are, or trajectories and exceptions gathered into one group."""
    given = list(items or [])
    if all(isinstance(item, TrajectoryGroup) for item in given):
        groups: list[TrajectoryGroup] = given  # type: ignore[assignment]
    elif all(isinstance(item, Trajectory | BaseException | RolloutException) for item in given):
        failed: list[RolloutException] = [
            item if isinstance(item, RolloutException) else RolloutException.from_exception(item)
            for item in given
            if not isinstance(item, Trajectory)
        ]
        groups = [TrajectoryGroup([t for t in given if isinstance(t, Trajectory)], exceptions=failed)]
    else:
        raise TypeError("log() takes trajectory groups, or trajectories (and exceptions) that make one group")
    if any(group.pending for group in groups):
        raise ArtError("a group still has unfinished rollouts; gather them (gather_trajectory_groups) before log()")
    return groups
