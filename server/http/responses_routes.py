"""Placeholder router (filled in by the protocol's module)."""

from __future__ import annotations

from fastapi import APIRouter

from art_agents.server.service import ArtService


def responses_routes(service: ArtService) -> APIRouter:
    return APIRouter()
