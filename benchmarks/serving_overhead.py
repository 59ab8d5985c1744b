"""Serving overhead: the art-agents server (HTTP + OpenAI SDK + token store) vs raw `model.generate`.

Same tiny model, same LoRA, same prompts, greedy decoding. Reports seconds per generated token
for each path and their ratio, sequentially (one request at a time: per-request overhead) and
concurrently (all prompts at once: the server batches them; the baseline is one batched
`generate` call).

    python benchmarks/serving_overhead.py [--prompts 8] [--max-tokens 32] [--model PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import tempfile
import threading
import time
from pathlib import Path

PROMPTS = [
    "What is 2 + 2?",
    "Name a colour.",
    "Say hello to the user.",
    "What is the capital of France?",
    "Write one word about the sea.",
    "Count to three.",
    "Is water wet?",
    "Describe a cat in five words.",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def raw_generate(model_path: str, messages: list[list[dict]], max_tokens: int) -> tuple[float, float, int, int]:
    """(sequential s, batched s, sequential tokens, batched tokens) with plain `model.generate`."""
    import torch

    from art_agents.server.chat_format import render_prompt_ids
    from art_agents.server.engine import load_peft_model
    from art_agents.train_config import ModelConfig

    model, tokenizer = load_peft_model(model_path, ModelConfig())
    prompts = [render_prompt_ids(tokenizer, m, None) for m in messages]
    options = dict(max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    with torch.inference_mode():
        model.generate(input_ids=torch.tensor([prompts[0]]), **options)  # warm-up
        started, seq_tokens = time.perf_counter(), 0
        for ids in prompts:
            out = model.generate(
                input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), **options
            )
            seq_tokens += out.shape[1] - len(ids)
        sequential = time.perf_counter() - started
        width = max(map(len, prompts))
        batch = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        started = time.perf_counter()
        out = model.generate(input_ids=batch, attention_mask=mask, **options)
        batched = time.perf_counter() - started
        generated = out[:, width:]
        batch_tokens = int(
            sum(_length(row.tolist(), tokenizer.pad_token_id, tokenizer.eos_token_id) for row in generated)
        )
    return sequential, batched, seq_tokens, batch_tokens


def _length(row: list[int], pad: int, eos: int) -> int:
    return next((i + 1 for i, t in enumerate(row) if t == eos), len([t for t in row if t != pad]))


def served(model_path: str, messages: list[list[dict]], max_tokens: int, folder: Path) -> tuple[float, float, int, int]:
    """The same through the real server (keeping its files in `folder`) and the OpenAI SDK."""
    import openai
    import uvicorn

    from art_agents.server.app import create_app

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(folder), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        import httpx

        httpx.post(
            f"http://127.0.0.1:{port}/v1/art/models", json={"name": "bench", "base_model": model_path}, timeout=300
        ).raise_for_status()
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")

        async def one(m: list[dict]) -> int:
            response = await client.chat.completions.create(
                model="bench", messages=m, max_tokens=max_tokens, temperature=0
            )
            return response.usage.completion_tokens

        async def run() -> tuple[float, float, int, int]:
            await one(messages[0])  # warm-up
            started, seq_tokens = time.perf_counter(), 0
            for m in messages:
                seq_tokens += await one(m)
            sequential = time.perf_counter() - started
            started = time.perf_counter()
            batch_tokens = sum(await asyncio.gather(*(one(m) for m in messages)))
            return sequential, time.perf_counter() - started, seq_tokens, batch_tokens

        return asyncio.run(run())
    finally:
        server.should_exit = True
        thread.join(timeout=30)  # shut down before the caller removes its folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model", help="model folder (default: build the tiny model in a temp folder)")
    args = parser.parse_args()
    messages = [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(args.prompts)]
    with tempfile.TemporaryDirectory(prefix="art-serving-") as folder:
        model_path = args.model
        if model_path is None:
            from art_agents.server.tiny_model import build_tiny_model

            model_path = str(build_tiny_model(Path(folder) / "tiny"))
        raw = raw_generate(model_path, messages, args.max_tokens)
        srv = served(model_path, messages, args.max_tokens, Path(folder) / "art")
    for label, i in (("sequential", 0), ("concurrent/batched", 1)):
        raw_per_token, srv_per_token = raw[i] / raw[i + 2], srv[i] / srv[i + 2]
        print(
            f"{label:>19}: raw generate {raw_per_token * 1000:.2f} ms/token ({raw[i + 2]} tokens), "
            f"server {srv_per_token * 1000:.2f} ms/token ({srv[i + 2]} tokens), ratio server/raw {srv_per_token / raw_per_token:.2f}x"
        )


if __name__ == "__main__":
    main()
