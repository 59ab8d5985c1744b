"""ART's `art.langgraph` under our name: `from art_agents.langgraph import init_chat_model, wrap_rollout`.

Needs the `langgraph` extra. The implementation lives in `art_agents.integrations.art_langgraph`;
our own LangGraph door is `art_agents.integrations.langgraph` (`wrap`, `graph_rollout`).
"""

from art_agents.integrations.art_langgraph import init_chat_model, wrap_rollout

__all__ = ["init_chat_model", "wrap_rollout"]
