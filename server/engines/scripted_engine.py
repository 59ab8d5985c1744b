"""A test engine that answers given texts, so tool-call paths can be tested on a random model.

A random tiny model never emits a tool call. This engine answers `ModelConfig.scripted_responses`
in order (cycling), one per choice, as token ids of the real tokenizer followed by the end-of-turn
token (unless the text ends with a stop token of its own), with the logprobs the served model assigns to those tokens. Everything after generation
(tool-call parsing, the token store, training on the stored tokens) is the real code path.
"""

from __future__ import annotations

import itertools
from typing import Any

from art_agents.server.engines.protocol import OlderStep, Sample
from art_agents.server.engines.requests import Request
from art_agents.server.engines.transformers_engine import TransformersEngine
from art_agents.server.models.lora_model import load_peft_model
from art_agents.train_config import ModelConfig


class ScriptedEngine(TransformersEngine):
    def __init__(self, model: Any, tokenizer: Any, config: ModelConfig, *, step: int = 0) -> None:
        super().__init__(model, tokenizer, config, step=step)
        if not config.scripted_responses:
            raise ValueError("engine 'scripted' needs a non-empty scripted_responses list")
        self._texts = itertools.cycle(config.scripted_responses)
        self._end_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else min(self._stop_ids)

    @classmethod
    def load(cls, base_model: str, config: ModelConfig) -> ScriptedEngine:
        model, tokenizer = load_peft_model(base_model, config)
        return cls(model, tokenizer, config)

    def _run_batch(self, older: OlderStep | None, step: int) -> None:
        while requests := self._take(older, 0):
            for request in requests:
                try:
                    self._answer(request, [self._scripted(request, choice, step) for choice in range(request.params.n)])
                except Exception as exc:
                    self._answer(request, exc)

    def _scripted(self, request: Request, choice: int, step: int) -> Sample:
        import torch

        text = next(self._texts)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids or ids[-1] not in self._stop_ids:  # a text may end its turn its family's way (GPT-OSS's <|call|>)
            ids.append(self._end_id)
        finish = "stop"
        if len(ids) > request.params.max_tokens:
            ids, finish = ids[: request.params.max_tokens], "length"
        full = torch.tensor([request.prompt_ids + ids], device=self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=full).logits[0, len(request.prompt_ids) - 1 : -1].float()
        basis = request.params.logprob_temperature
        logprobs = torch.log_softmax(logits / basis, dim=-1).gather(1, torch.tensor(ids, device=self.device)[:, None])[
            :, 0
        ]
        if request.on_token is not None:
            request.streamed = True
            for token in ids:
                request.on_token(choice, token)
        decoded = self._decode(ids[:-1] if finish == "stop" else ids)
        return Sample(
            token_ids=ids,
            logprobs=logprobs.tolist(),
            text=decoded,
            finish_reason=finish,
            step=step,
            temperature=basis,
        )
