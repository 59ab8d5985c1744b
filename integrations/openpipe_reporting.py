"""OpenPipe reporter: every model call of a train or log step as one logged completion, with its rollout's reward.

OpenPipe (openpipe.ai) keeps chat completions to inspect and to build fine-tuning datasets from. After each
step, when the rewards are known, every turn of every trajectory is posted as OpenAI chat payloads: the
request (the messages before the reply, the history's tools, `name@step` as the model) and the response (the
assistant message, finish reason, token usage). Its metadata lets OpenPipe filter and sort by run, step and
reward: `project`, `model`, `split`, `step`, `group`, `trajectory_id`, `turn`, `policy_step`, `reward` and
the trajectory's metrics under their own names (all strings, as OpenAI metadata is).

It is on with `report_to=["openpipe"]`, or by itself when `OPENPIPE_API_KEY` is set (see
`art_agents.report.reporters`); `OPENPIPE_BASE_URL` points it at another OpenPipe, as for OpenPipe's SDK.

The wire format is the SDK's `report` call (openpipe 5.0, `openpipe/api_client/client.py`): POST
`<base>/report` with `Authorization: Bearer <key>` and `requestedAt`/`receivedAt` (ms), `reqPayload`,
`respPayload`, `statusCode` and `tags`. It is spoken with httpx here: the SDK pins openai<=1.97 and httpx<0.29.
The metadata goes in `reqPayload.metadata`, where OpenPipe reads it now, and again as `tags`, which its API
marks deprecated but the open-source OpenPipe server reads instead.

OpenPipe being slow or down never slows or breaks training: `record` only queues the step (past
`MAX_PENDING_RECORDS` waiting, a step is dropped with a warning) and returns. A thread of the reporter posts a
step's calls `CONCURRENT_POSTS` at a time, each within `TIMEOUT_S`, and gives up on the rest of the step at
the first refusal that later calls would meet too (host unreachable, a timeout, bad key, 5xx, rate limit), so
a dead host costs that thread one timeout per step. Failures become one warning per kind, and `close()` waits
at most two timeouts for what is still queued: time for a step that meets a dead host to be given up.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import httpx

from art_agents.errors import ArtError
from art_agents.integrations.queued_reporter import QueuedReporter
from art_agents.report.reporters import OPENPIPE_KEY, ReportedModel, StepRecord
from art_agents.trajectory import Trajectory

BASE_URL_ENV = "OPENPIPE_BASE_URL"
DEFAULT_BASE_URL = "https://api.openpipe.ai/api/v1"  # the SDK's default
TIMEOUT_S = 5.0  # per post
CONCURRENT_POSTS = 8
# Statuses that refuse one call for what it holds (malformed, too large): the step's other calls still go.
CALL_REFUSED = {400, 413, 422}


class OpenPipeWarning(RuntimeWarning):
    """OpenPipe did not take some completions; training is unaffected."""


class _StepStopped(Exception):
    """A post failed in a way that every later post of the step would too; `kind` names the way, for the warning."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class OpenPipeReporter(QueuedReporter):
    """Posts every model call of one model's train and log steps to OpenPipe, from a thread of its own."""

    service, warning, items = "OpenPipe", OpenPipeWarning, "completions"

    def __init__(self, model: ReportedModel) -> None:
        api_key = os.environ.get(OPENPIPE_KEY, "").strip()
        if not api_key:
            raise ArtError(
                f"report_to='openpipe' needs {OPENPIPE_KEY} (a project's key, from app.openpipe.ai/settings) in the "
                f"environment, and {BASE_URL_ENV} for another OpenPipe than {DEFAULT_BASE_URL}; set it, or drop "
                "'openpipe' from report_to"
            )
        self.project = model.project
        self.base_url = (os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")
        if not self.base_url.startswith(("http://", "https://")):
            raise ArtError(f"{BASE_URL_ENV}={self.base_url!r} is not an http(s) URL; e.g. {DEFAULT_BASE_URL}")
        super().__init__(model.name, self.base_url)
        self._api_key = api_key  # only ever sent: `_redacted` blanks it out of any error text that quotes it
        self._headers = {"Authorization": f"Bearer {api_key}"}

    def close(self) -> None:
        """Wait at most two timeouts for the queued steps to be posted; what is left goes on in the background."""
        wait_s = 2 * TIMEOUT_S
        if not self._drained(wait_s):
            self._warn(
                "close",
                f"{self.base_url} did not take the queued completions within {wait_s:g}s; they are "
                "posted in the background until the process exits",
            )

    def _send(self, record: StepRecord) -> None:
        """Post one step's calls; the first failure that would repeat gives up the rest of the step."""
        try:
            if calls := self._calls(record):
                asyncio.run(self._post(calls))
        except* _StepStopped as stopped:
            cause = stopped.exceptions[0]
            assert isinstance(cause, _StepStopped)
            self._warn(
                f"stopped:{cause.kind}",
                f"{self.base_url} did not take the completions of {record.split} step {record.step} ({cause}); "
                "the rest of that step is not sent (the same failure is not warned about again)",
            )
        except* Exception as failed:
            error = failed.exceptions[0]
            self._warn(f"post:{type(error).__name__}", f"could not post {record.split} step {record.step}", error)

    async def _post(self, calls: list[dict[str, Any]]) -> None:
        """Post the calls a few at a time; the first failure that would repeat cancels the rest (ExceptionGroup)."""
        limit = asyncio.Semaphore(CONCURRENT_POSTS)
        async with httpx.AsyncClient(base_url=f"{self.base_url}/", headers=self._headers, timeout=TIMEOUT_S) as client:

            async def post(call: dict[str, Any]) -> None:
                async with limit:
                    try:
                        response = await client.post("report", json=call)
                    except httpx.TransportError as exc:  # unreachable, or a timeout
                        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                        raise _StepStopped(type(exc).__name__, detail) from exc
                if response.status_code in CALL_REFUSED:
                    self._warn(
                        f"refused:{response.status_code}", f"{self.base_url} refused a completion ({_answer(response)})"
                    )
                elif response.is_error:
                    raise _StepStopped(f"HTTP {response.status_code}", _answer(response))

            async with asyncio.TaskGroup() as tasks:
                for call in calls:
                    tasks.create_task(post(call))

    def _calls(self, record: StepRecord) -> list[dict[str, Any]]:
        """The report bodies of the step's model calls; a trajectory that cannot be read is skipped with a warning.

        Rollouts that raised are left out: their reward is not a score, and OpenPipe would show it beside the
        completions as one.
        """
        calls = []
        for group_index, group in enumerate(record.groups):
            for trajectory in group.trajectories:
                try:
                    calls += self._trajectory_calls(trajectory, record, group_index)
                except Exception as exc:
                    self._warn(f"read:{type(exc).__name__}", f"could not read trajectory {trajectory.id}", exc)
        return calls

    def _trajectory_calls(self, trajectory: Trajectory, record: StepRecord, group_index: int) -> list[dict[str, Any]]:
        """One report per model call, as the OpenAI SDK would have sent and received it, tagged with the rollout."""
        about = {
            **trajectory.metrics,  # under their own names, as OpenPipe users tag calls; ours win a clash
            "project": self.project,
            "model": self.model_name,
            "split": record.split,
            "step": record.step,
            "group": group_index,
            "trajectory_id": trajectory.id,
            "reward": trajectory.reward,
        }
        wires: dict[int, list[dict[str, Any]]] = {}  # each history's messages dumped once, not once per turn
        calls = []
        for number, turn in enumerate(trajectory.turns):
            if turn.history not in wires:
                wires[turn.history] = [m.wire() for m in trajectory.history_messages(turn.history)]
            messages = wires[turn.history]
            reply = messages[turn.index]
            metadata = _metadata({**about, "turn": number, "policy_step": turn.policy_step})
            model = turn.model or self.model_name
            request: dict[str, Any] = {"model": model, "messages": messages[: turn.index], "metadata": metadata}
            tools = trajectory.tools if turn.history == 0 else trajectory.additional_histories[turn.history - 1].tools
            if tools:
                request["tools"] = tools
            requested_at = turn.started_at if turn.started_at is not None else trajectory.started_at
            response: dict[str, Any] = {
                "id": turn.completion_id or f"{trajectory.id}-{number}",
                "object": "chat.completion",
                "created": int(requested_at),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": reply,
                        "finish_reason": turn.finish_reason or ("tool_calls" if reply.get("tool_calls") else "stop"),
                    }
                ],
            }
            if turn.usage:
                response["usage"] = turn.usage
            calls.append(
                {
                    "requestedAt": round(requested_at * 1000),
                    "receivedAt": round((requested_at + turn.latency_s) * 1000),
                    "reqPayload": request,
                    "respPayload": response,
                    "statusCode": 200,
                    "tags": metadata,
                }
            )
        return calls

    def _redacted(self, text: str) -> str:
        return text.replace(self._api_key, "<OPENPIPE_API_KEY>")


def _metadata(values: dict[str, Any]) -> dict[str, str]:
    """OpenAI metadata: string values; numbers and booleans as JSON text, unknown ones left out."""
    return {key: v if isinstance(v, str) else json.dumps(v) for key, v in values.items() if v is not None}


def _answer(response: httpx.Response) -> str:
    """The status and the start of the body: OpenPipe says there what was wrong (a bad key, a bad payload)."""
    return f"HTTP {response.status_code} {response.reason_phrase}: {response.text[:200]}".rstrip(": ")
