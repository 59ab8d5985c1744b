"""RULER: relative rewards for a group of trajectories from one LLM judge call."""

from art_agents.llm import Backoff, KeyProblem, check_key
from art_agents.ruler.cache import JudgeCache, default_cache_dir
from art_agents.ruler.judge import InvalidJudgement, JudgeCall, JudgeScore, RulerError, parse_judgement
from art_agents.ruler.prompt import DEFAULT_RUBRIC, common_prefix_length, render_judge_messages
from art_agents.ruler.score import DEFAULT_JUDGE, RulerResult, kendall_tau, pass_orders, ruler, ruler_score_group

__all__ = [
    "DEFAULT_JUDGE",
    "DEFAULT_RUBRIC",
    "Backoff",
    "InvalidJudgement",
    "JudgeCache",
    "JudgeCall",
    "JudgeScore",
    "KeyProblem",
    "RulerError",
    "RulerResult",
    "check_key",
    "common_prefix_length",
    "default_cache_dir",
    "kendall_tau",
    "parse_judgement",
    "pass_orders",
    "render_judge_messages",
    "ruler",
    "ruler_score_group",
]
