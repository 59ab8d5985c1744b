"""Capture through the server: any HTTP client, any protocol, any process.

Inside `art.rollout()`, a request to a known art-agents server (one a backend was made for) made through
httpx, requests or aiohttp carries the rollout's id and asks the server to keep the call; an agent in
another process gets a rollout-scoped base URL (`<server>/r/<rollout id>/v1`). Either way the server
records each call in chat form, whatever protocol it spoke (Chat Completions, Responses, Anthropic
Messages, Completions), and the rollout fetches and assembles them when it ends.

The hooks are installed on the client classes once, but act only inside a rollout and only on requests
to a known server: every other request passes through untouched. Clients the toolkit builds record on
their own (transport.py) and are left alone.
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any

import httpx

from art_agents.backends.transport import (
    MODEL_ROUTES,
    CaptureAsyncTransport,
    CaptureTransport,
    is_chat_completion,
    overridden,
    with_overrides,
)
from art_agents.capture import add_rollout_hooks, current_trajectory, record_completion, request_overrides
from art_agents.trajectory import Trajectory
from art_agents.wire import API_PREFIX, ROLLOUT_HEADER, ROLLOUT_PATH, ROLLOUT_RECORD_HEADER, RolloutRecord

_servers: dict[str, str | None] = {}  # base URL (no /v1) -> API key
_hooked: set[str] = set()


def remember_server(base_url: str, api_key: str | None) -> None:
    """Make `base_url` (an art-agents server, without `/v1`) one whose calls inside a rollout are captured."""
    _servers[base_url.rstrip("/")] = api_key
    install_hooks()
    add_rollout_hooks(_ServerCalls())


class _ServerCalls:
    """Rollout hooks: hook clients imported since, and assemble the server's calls at the end."""

    def enter(self) -> None:
        install_hooks()

    def exit(self, trajectory: Trajectory) -> None:
        if servers_of(trajectory):
            finish(trajectory)

    async def aexit(self, trajectory: Trajectory) -> None:
        if servers_of(trajectory):
            await afinish(trajectory)

    def __eq__(self, other: object) -> bool:  # one set of hooks however many servers are remembered
        return isinstance(other, _ServerCalls)

    def __hash__(self) -> int:
        return hash(_ServerCalls)


def server_of(url: str) -> str | None:
    """The known server `url` points into, or None."""
    return next((base for base in _servers if url.startswith(f"{base}/")), None)


def _tag(url: str, headers: Any) -> None:
    """Set the rollout headers on a model call to a known server made inside a rollout."""
    trajectory = current_trajectory()
    if trajectory is None or ROLLOUT_HEADER in headers:  # outside a rollout, or captured by its own client
        return
    base = server_of(url)
    if base is None or url.startswith((f"{base}{API_PREFIX}/", f"{base}{ROLLOUT_PATH}/")):
        return
    headers[ROLLOUT_HEADER] = trajectory.id
    headers[ROLLOUT_RECORD_HEADER] = "1"
    servers_of(trajectory).add(base)


def _is_model_call(method: str | None, url: str) -> bool:
    """A model call (any protocol) to a known server: where an evaluation's pinned step and decoding apply."""
    path = url.split("?", 1)[0]
    return method == "POST" and server_of(url) is not None and path.endswith(MODEL_ROUTES)


def servers_of(trajectory: Trajectory) -> set[str]:
    """The servers that hold calls of this trajectory to assemble when its rollout ends."""
    return trajectory._servers  # private: carried for this module only


def install_hooks() -> None:
    """Hook httpx now, and httpx2 (the openai SDK's own client since openai 3), requests and aiohttp once they are
    imported (called again at each rollout's start)."""
    for name in ("httpx", "httpx2"):
        if name not in _hooked and name in sys.modules:
            _hooked.add(name)
            _hook_httpx(sys.modules[name])
    if "requests" not in _hooked and "requests" in sys.modules:
        _hooked.add("requests")
        _hook_requests()
    if "aiohttp" not in _hooked and "aiohttp" in sys.modules:
        _hooked.add("aiohttp")
        _hook_aiohttp()


def _captures_itself(client: httpx.Client | httpx.AsyncClient, request: httpx.Request) -> bool:
    """Whether the client's own transport records this request (chat completions only; other protocols are
    captured here)."""
    own = isinstance(getattr(client, "_transport", None), CaptureTransport | CaptureAsyncTransport)
    return own and is_chat_completion(request)


def _hook_httpx(module: Any) -> None:
    """Hook `module`'s clients: httpx, or httpx2, its fork with the same API."""
    sync_send, async_send = module.Client.send, module.AsyncClient.send

    def prepared(client: httpx.Client | httpx.AsyncClient, request: httpx.Request) -> httpx.Request:
        if not _servers or _captures_itself(client, request):
            return request
        if server_of(str(request.url)) is not None:  # an evaluation's pinned step and decoding, in any protocol
            request = overridden(request)
        _tag(str(request.url), request.headers)
        return request

    @functools.wraps(sync_send)
    def send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        return sync_send(self, prepared(self, request), **kwargs)

    @functools.wraps(async_send)
    async def asend(self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        return await async_send(self, prepared(self, request), **kwargs)

    module.Client.send = send
    module.AsyncClient.send = asend


def _hook_requests() -> None:
    import requests

    original = requests.Session.send

    @functools.wraps(original)
    def send(self: requests.Session, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        url = str(request.url)
        if _servers and _is_model_call(request.method, url) and (body := with_overrides(request.body)) is not None:
            request.body = body
            request.headers["Content-Length"] = str(len(body))
        if _servers:
            _tag(url, request.headers)
        return original(self, request, **kwargs)

    requests.Session.send = send  # type: ignore[method-assign]


def _hook_aiohttp() -> None:
    import aiohttp

    original = aiohttp.ClientSession._request  # every request method goes through it

    @functools.wraps(original)
    async def request(self: aiohttp.ClientSession, method: str, url: Any, **kwargs: Any) -> Any:
        if not _servers:
            return await original(self, method, url, **kwargs)
        base = getattr(self, "_base_url", None)
        full = str(base.join(aiohttp.client.URL(str(url))) if base is not None else url)
        if _is_model_call(method, full) and (fields := request_overrides()) and isinstance(kwargs.get("json"), dict):
            kwargs["json"] = {**kwargs["json"], **fields}
        elif _is_model_call(method, full) and (body := with_overrides(kwargs.get("data"))) is not None:
            kwargs["data"] = body
        if current_trajectory() is not None:
            headers = dict(kwargs.get("headers") or {})
            _tag(full, headers)
            kwargs["headers"] = headers
        return await original(self, method, url, **kwargs)

    aiohttp.ClientSession._request = request  # type: ignore[method-assign]


def _finish_request(trajectory: Trajectory, base: str) -> tuple[str, dict[str, str]]:
    key = _servers.get(base)
    return f"{base}{API_PREFIX}/rollouts/{trajectory.id}/finish", {"Authorization": f"Bearer {key}"} if key else {}


def assemble(trajectory: Trajectory, record: RolloutRecord) -> None:
    """Add the calls the server kept for this rollout to the trajectory (a call captured already is skipped)."""
    for call in record.calls:
        record_completion(
            call.messages,
            call.message,
            tools=call.tools,
            completion_id=call.completion_id,
            model=call.model,
            latency_s=call.latency_s,
            finish_reason=call.finish_reason,
            usage=call.usage,
            trajectory=trajectory,
            started_at=call.started_at,
        )


def _lost(trajectory: Trajectory, base: str, exc: Exception) -> None:
    message = (
        f"the calls of rollout {trajectory.id} could not be fetched from {base} ({exc}); they are missing from the "
        "trajectory (is the server still running?)"
    )
    trajectory.log(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


async def afinish(trajectory: Trajectory) -> None:
    """Fetch and assemble the calls every server kept for this rollout (async: inside an event loop)."""
    for base in sorted(servers_of(trajectory)):
        url, headers = _finish_request(trajectory, base)
        try:
            async with httpx.AsyncClient(timeout=60) as http:
                response = await http.post(url, headers=headers)
                response.raise_for_status()
        except httpx.HTTPError as exc:
            _lost(trajectory, base, exc)
            continue
        assemble(trajectory, RolloutRecord.model_validate_json(response.content))
    servers_of(trajectory).clear()


def finish(trajectory: Trajectory) -> None:
    """As `afinish`, for a rollout closed with a plain `with`."""
    for base in sorted(servers_of(trajectory)):
        url, headers = _finish_request(trajectory, base)
        try:
            response = httpx.post(url, headers=headers, timeout=60)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            _lost(trajectory, base, exc)
            continue
        assemble(trajectory, RolloutRecord.model_validate_json(response.content))
    servers_of(trajectory).clear()


async def open_scoped(trajectory: Trajectory, base: str, api_key: str | None) -> str:
    """Open `<base>/r/<trajectory id>/v1` on the server and return it; its calls are assembled at the end."""
    remember_server(base, api_key)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(f"{base}{API_PREFIX}/rollouts/{trajectory.id}/open", headers=headers)
    if response.status_code >= 400:
        from art_agents.errors import ArtError

        raise ArtError(f"the server at {base} refused to open rollout {trajectory.id}: {response.text}")
    servers_of(trajectory).add(base)
    return f"{base}{ROLLOUT_PATH}/{trajectory.id}/v1"
