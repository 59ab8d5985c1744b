"""Schemathesis drives every route of the server's own OpenAPI schema: no 5xx, no hang."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from server_fixtures import start_server
from test_server_admin import register


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_no_route_answers_a_server_error(tmp_path: Path, tiny_model_path: Path) -> None:
    with start_server(tmp_path / "art") as url:
        assert register(url, "m", tiny_model_path, default_max_tokens=8).status_code == 200
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 9  # every route of the schema, the chat and training routes among them
        for operation in operations:
            no_server_error(operation)


def no_server_error(operation: Any) -> None:
    @given(operation.as_strategy())
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case: Any) -> None:
        response = case.call(timeout=60)
        assert response.status_code < 500, (
            f"{operation.method.upper()} {operation.path}: {response.status_code} {response.text[:300]}"
        )

    check()
