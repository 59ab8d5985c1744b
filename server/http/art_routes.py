"""The versioned /v1/art routes: register a model, train it, log evaluations, manage its checkpoints."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from starlette.types import Send

from art_agents import wire
from art_agents.server.service import ArtService
from art_agents.server.serving.served_model import check_name


def art_routes(service: ArtService) -> APIRouter:
    router = APIRouter(prefix=wire.API_PREFIX)

    @router.post("/models")
    async def register(body: wire.RegisterRequest) -> wire.ModelInfo:
        return await service.register(body)

    @router.get("/models/{name}/step")
    async def get_step(name: str) -> wire.StepInfo:
        return wire.StepInfo(step=service.get(name).step)

    @router.get("/models/{name}/checkpoints")
    async def checkpoints(name: str) -> list[wire.CheckpointInfo]:
        return service.list_checkpoints(name)

    @router.post("/models/{name}/checkpoints/delete")
    async def delete_checkpoints(name: str, body: wire.DeleteCheckpointsRequest) -> list[int]:
        return await service.delete_checkpoints(name, body)

    @router.post("/models/{name}/fork")
    async def fork(name: str, body: wire.ForkRequest) -> wire.ForkResult:
        """Serve another model's checkpoint (same base model and LoRA) as this model's, under its step number."""
        return await service.fork(name, body)

    @router.post("/models/{name}/log")
    async def log_groups(name: str, body: wire.LogRequest) -> wire.LogResult:
        """Record evaluation groups (a split such as val) at the served step, without training."""
        return await service.log(name, body)

    @router.post("/models/{name}/train", response_model=None)
    async def train(name: str, body: wire.TrainRequest) -> StreamingResponse:
        """One GRPO step; NDJSON progress events, then a result or error event."""
        return await _ndjson(service.train(name, body))

    @router.post("/models/{name}/train_sft", response_model=None)
    async def train_sft(name: str, body: wire.TrainSFTRequest) -> StreamingResponse:
        """One supervised fine-tuning call on demonstrations; the same NDJSON events as train."""
        return await _ndjson(service.train_sft(name, body))

    @router.get("/rollouts/{rollout_id}")
    async def rollout_calls(rollout_id: str) -> wire.RolloutRecord:
        """How many completions the rollout was answered, and the calls kept for its assembly."""
        return service.rollouts.record(rollout_id)

    @router.post("/rollouts/{rollout_id}/open")
    async def open_rollout(rollout_id: str) -> wire.RolloutRecord:
        """Open `/r/<rollout_id>/v1` for an agent in another process; every call through it is kept."""
        check_name(rollout_id, "rollout id")
        return service.rollouts.open(rollout_id)

    @router.post("/rollouts/{rollout_id}/finish")
    async def finish_rollout(rollout_id: str) -> wire.RolloutRecord:
        """Close the rollout's URL and hand over its kept calls (the server forgets them)."""
        return service.rollouts.finish(rollout_id)

    return router


async def _ndjson(events: AsyncGenerator[wire.TrainEvent, None]) -> StreamingResponse:
    """Stream train events as NDJSON; input errors raise from the first event, before any 200 is sent."""
    first = await anext(events)

    async def lines() -> AsyncGenerator[str, None]:
        async with contextlib.aclosing(events):
            yield first.model_dump_json() + "\n"
            async for event in events:
                yield event.model_dump_json() + "\n"

    return _ClosingStream(lines())


class _ClosingStream(StreamingResponse):
    """NDJSON lines that are closed when the client hangs up mid-stream (starlette stops reading them on a failed
    send but leaves them to the garbage collector): the step goes on in its own task and the log says so at once."""

    def __init__(self, lines: AsyncGenerator[str, None]) -> None:
        super().__init__(lines, media_type="application/x-ndjson")
        self._lines = lines

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self._lines.aclose()
