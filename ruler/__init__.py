"""RULER: relative rewards for a group of trajectories from one LLM judge call."""
