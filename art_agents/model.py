"""Models: a prompted baseline anywhere, and a trainable LoRA on an art-agents server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

from pydantic import ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator

from art_agents.errors import ArtError
from art_agents.names import check_safe_name
from art_agents.schema import Schema
from art_agents.train_config import ModelConfig, TrainConfig
from art_agents.wire import TrainResult

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI
    from openai import AsyncOpenAI, OpenAI

    from art_agents.backend import Backend
    from art_agents.trajectory import TrajectoryGroup


class Model(Schema):
    """A model behind any OpenAI-compatible endpoint, e.g. a prompted baseline for comparison.

    Rollout code takes a `Model` and calls `openai_client()`; the same code then runs against a
    `TrainableModel`, and every call it makes inside a rollout is captured.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    project: str = "default"
    inference_base_url: str | None = None
    inference_api_key: str | None = None
    inference_model_name: str | None = Field(None, description="Model name sent to the endpoint; defaults to `name`.")

    @overload
    def openai_client(self, *, sync: Literal[False] = False, **kwargs: Any) -> AsyncOpenAI: ...
    @overload
    def openai_client(self, *, sync: Literal[True], **kwargs: Any) -> OpenAI: ...
    def openai_client(self, *, sync: bool = False, **kwargs: Any) -> AsyncOpenAI | OpenAI:
        """An OpenAI SDK client whose chat completions are captured inside rollouts."""
        import httpx
        import openai

        from art_agents.transport import CaptureAsyncTransport, CaptureTransport

        base_url, api_key = self.endpoint()
        if sync:
            return openai.OpenAI(
                base_url=base_url, api_key=api_key, http_client=httpx.Client(transport=CaptureTransport()), **kwargs
            )
        http_client = httpx.AsyncClient(transport=CaptureAsyncTransport())
        return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, **kwargs)

    def chat_model(self, **kwargs: Any) -> ChatOpenAI:
        """A LangChain `ChatOpenAI` for this model, captured inside rollouts (needs the `langgraph` extra)."""
        from art_agents.integrations.langgraph import chat_model

        return chat_model(self, **kwargs)

    def litellm_completion_params(self) -> dict[str, Any]:
        """Keyword arguments for `litellm.acompletion` that reach this model."""
        base_url, api_key = self.endpoint()
        return {"model": f"openai/{self.served_name}", "api_base": base_url, "api_key": api_key}

    @property
    def served_name(self) -> str:
        return self.inference_model_name or self.name

    def endpoint(self) -> tuple[str, str]:
        """(base URL, API key) of the model's OpenAI-compatible server, for clients built elsewhere."""
        if self.inference_base_url is None:
            raise ArtError(
                f"model {self.name!r} has no inference_base_url; set it, or register a TrainableModel with a backend first"
            )
        return self.inference_base_url, self.inference_api_key or "art-agents"


class TrainableModel(Model):
    """A LoRA on `base_model` (a hub id or a local folder) that an art-agents server serves and trains."""

    base_model: str
    config: ModelConfig = Field(default_factory=ModelConfig)
    _backend: Backend | None = PrivateAttr(default=None)

    @field_validator("name", "project")
    @classmethod
    def _safe_path_component(cls, value: str, info: ValidationInfo) -> str:
        return check_safe_name(value, info.field_name or "name")

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise ArtError(f"model {self.name!r} is not registered; call `await model.register(backend)` first")
        return self._backend

    async def register(self, backend: Backend) -> None:
        """Create (or reopen) the model on the backend and point the inference client at it."""
        await backend.register(self)
        self._backend = backend
        self.inference_base_url = f"{backend.base_url}/v1"
        self.inference_api_key = backend.api_key
        self.inference_model_name = self.name

    async def get_step(self) -> int:
        return await self.backend.get_step(self)

    async def train(
        self, groups: list[TrajectoryGroup], config: TrainConfig | None = None, *, progress: bool = True
    ) -> TrainResult:
        """One GRPO step on the groups; returns when the new checkpoint is being served."""
        return await self.backend.train(self, groups, config, progress=progress)

    async def delete_checkpoints(self, steps: list[int] | None = None) -> list[int]:
        """Delete the given steps, or all but the latest; returns the deleted steps."""
        return await self.backend.delete_checkpoints(self, steps)
