"""`art_agents.rewards`: where ART users import RULER from (`art.rewards`); it lives in `art_agents.ruler`."""

from art_agents.ruler import DEFAULT_RUBRIC, RulerResult, ruler, ruler_score_group
from art_agents.ruler.judge import JudgeScore as TrajectoryScore

__all__ = ["DEFAULT_RUBRIC", "RulerResult", "TrajectoryScore", "ruler", "ruler_score_group"]
