"""The art-agents server: OpenAI-compatible serving of the latest LoRA and GRPO training."""
