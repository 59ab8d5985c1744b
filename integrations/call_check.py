"""After a rollout: did we capture every completion the server served for it?

Clients built by the toolkit send the rollout id in a header, and the art-agents server counts the
completions it answered per rollout id (`GET /v1/art/rollouts/{id}`). A model call that bypassed
capture (a raw client inside a tool, `callbacks=[]` on a node) then shows up as a difference,
which is worth a warning: its tokens would silently be missing from training.
"""

from __future__ import annotations

import warnings
from collections import Counter

import httpx
from pydantic import BaseModel

from art_agents.trajectory import Trajectory
from art_agents.wire import API_PREFIX

TIMEOUT_S = 5.0


class MissingCallsWarning(UserWarning):
    """The server answered more (or fewer) completions for a rollout than were captured."""


class RolloutCount(BaseModel):
    completions: int


def server_root(base_url: str) -> str:
    """`http://host:port/v1` -> `http://host:port` (the art routes live beside the OpenAI ones)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _count_url(base_url: str, rollout_id: str) -> str:
    return f"{server_root(base_url)}{API_PREFIX}/rollouts/{rollout_id}"


def _parse(response: httpx.Response) -> int | None:
    if response.status_code != 200:
        return None  # not an art-agents server (or an older one): nothing to compare with
    try:
        return RolloutCount.model_validate_json(response.content).completions
    except ValueError:
        return None


def served(base_urls: set[str], rollout_id: str, api_key: str | None = None) -> int | None:
    """Completions the servers answered for this rollout id; None when none of them can say."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    counts: list[int] = []
    with httpx.Client(timeout=TIMEOUT_S, headers=headers) as client:
        for base_url in sorted(base_urls):
            try:
                count = _parse(client.get(_count_url(base_url, rollout_id)))
            except httpx.HTTPError:
                count = None
            if count is not None:
                counts.append(count)
    return sum(counts) if counts else None


async def served_async(base_urls: set[str], rollout_id: str, api_key: str | None = None) -> int | None:
    """`served` without blocking the event loop."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    counts: list[int] = []
    async with httpx.AsyncClient(timeout=TIMEOUT_S, headers=headers) as client:
        for base_url in sorted(base_urls):
            try:
                count = _parse(await client.get(_count_url(base_url, rollout_id)))
            except httpx.HTTPError:
                count = None
            if count is not None:
                counts.append(count)
    return sum(counts) if counts else None


def compare(trajectory: Trajectory, served_count: int | None, nodes: list[str], failed_nodes: list[str]) -> str | None:
    """Warn (and log on the trajectory) when the served and captured counts differ.

    A served count of 0 means no call carried the rollout header (a user-built client without
    `rollout_headers()`), so there is nothing to compare. Only turns answered by an art-agents
    server (`name@step`) count as captured, so calls to other providers do not raise alarms.
    """
    if not served_count:
        return None
    ours = [turn for turn in trajectory.turns if turn.policy_step is not None]
    if len(ours) == served_count:
        return None
    by_node = Counter(turn.span or "?" for turn in ours)
    ran = ", ".join(f"{node} ({by_node.get(node, 0)} captured)" for node in nodes) or "none seen"
    failed = f"; model calls failed in: {', '.join(sorted(set(failed_nodes)))}" if failed_nodes else ""
    message = (
        f"rollout {trajectory.id}: the server answered {served_count} completions but {len(ours)} were captured. "
        f"Nodes that ran: {ran}{failed}. A model call made outside LangChain callbacks and the toolkit's "
        "clients is not recorded and will not be trained on; make it through model.chat_model() or "
        "model.openai_client(), or pass the node's `config` on to the call."
    )
    trajectory.metrics["missing_calls"] = served_count - len(ours)
    trajectory.log(message)
    warnings.warn(message, MissingCallsWarning, stacklevel=3)
    return message
