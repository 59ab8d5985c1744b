"""AutoRL: tasks, a system prompt and a rubric invented from a plain description."""
