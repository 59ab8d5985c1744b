"""The art-agents server: OpenAI-compatible serving of the latest LoRA and GRPO training."""

from art_agents.server.host.cpu_threads import spin_briefly

spin_briefly()  # before any torch import of the server's: libgomp reads it once, when torch loads it
