"""Doors into existing agent code: LangGraph graphs, MCP tool sessions, observability."""
