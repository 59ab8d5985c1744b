"""A loopback stand-in for the Hugging Face Hub's routes that `HfApi.create_repo` and `upload_folder` call.

Every file is answered as a "regular" upload, so its bytes come inline (base64) in the commit, where a test reads
them back; nothing goes through LFS or Xet. `start_fake_hub()` serves it in a thread and yields the endpoint
(for HF_ENDPOINT) and the `FakeHub` that recorded the calls.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from server_fixtures import free_port


@dataclass
class FakeHub:
    repos: list[dict[str, Any]] = field(default_factory=list)  # the create-repo bodies
    authorizations: set[str] = field(default_factory=set)
    files: dict[str, bytes] = field(default_factory=dict)  # path in the repo -> bytes committed
    commit_summaries: list[str] = field(default_factory=list)


@contextlib.contextmanager
def start_fake_hub() -> Iterator[tuple[str, FakeHub]]:
    import uvicorn

    hub = FakeHub()
    app = FastAPI()

    @app.middleware("http")
    async def record_token(request: Request, call_next: Any) -> Any:
        if "authorization" in request.headers:
            hub.authorizations.add(request.headers["authorization"])
        return await call_next(request)

    @app.post("/api/repos/create")
    async def create(request: Request) -> dict[str, Any]:
        body = await request.json()
        hub.repos.append(body)
        return {"url": f"{str(request.base_url).rstrip('/')}/{body['organization']}/{body['name']}"}

    @app.post("/api/validate-yaml")
    async def validate_yaml() -> dict[str, Any]:
        return {"errors": [], "warnings": []}

    @app.post("/api/models/{owner}/{name}/preupload/{revision}")
    async def preupload(request: Request) -> dict[str, Any]:
        files = (await request.json())["files"]
        return {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}

    @app.post("/api/models/{owner}/{name}/commit/{revision}")
    async def commit(owner: str, name: str, request: Request) -> dict[str, Any]:
        for line in (await request.body()).decode().splitlines():
            item = json.loads(line)
            if item["key"] == "header":
                hub.commit_summaries.append(item["value"]["summary"])
            elif item["key"] == "file":
                hub.files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
        url = f"{str(request.base_url).rstrip('/')}/{owner}/{name}/commit/{'0' * 40}"
        return {"commitUrl": url, "commitOid": "0" * 40, "pullRequestUrl": None}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"fake-hub-{port}", daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", hub
    finally:
        server.should_exit = True
        thread.join(timeout=10)
