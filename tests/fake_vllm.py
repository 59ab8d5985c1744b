"""A stand-in for `vllm serve` on CPU: the routes the vLLM engine uses, in the JSON shapes of vLLM 0.34.

Run as `python fake_vllm.py serve BASE --host H --port P [vllm flags]` (tests put a wrapper script in
place of the vLLM python). Completions run the tiny model with the LoRA adapters it was told to load:
real token ids and real logprobs (processed, i.e. at the sampling temperature and after top-p, with
`--logprobs-mode processed_logprobs`; raw otherwise, as vLLM). As vLLM, the LoRA routes exist only
with VLLM_ALLOW_RUNTIME_LORA_UPDATING and the sleep routes only with VLLM_SERVER_DEV_MODE.

`serving(base, args, env)` runs it as a vLLM server started by someone else (ModelConfig.vllm_server_url or
vllm_nodes) and yields its URL. Test controls (environment): FAKE_VLLM_FAIL_START (exit at start with that message),
FAKE_VLLM_EVENTS (a file of one JSON line per start, adapter load/unload, sleep, wake and
completion), FAKE_VLLM_REJECT (refuse adapters whose name ends with it), FAKE_VLLM_TOKEN_DELAY
(seconds per streamed token).
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any


def _event(kind: str, **fields: Any) -> None:
    path = os.environ.get("FAKE_VLLM_EVENTS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": kind, "pid": os.getpid(), **fields}) + "\n")


def parse(argv: list[str]) -> argparse.Namespace:
    """`vllm serve`'s flags that art-agents passes, with vLLM 0.34's names, choices and defaults."""
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--max-lora-rank", type=int, choices=[1, 8, 16, 32, 64, 128, 256, 320, 512], default=16)
    parser.add_argument("--max-loras", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument(
        "--logprobs-mode",
        choices=["raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs"],
        default="raw_logprobs",
    )
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--enable-sleep-mode", action="store_true")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    parser.add_argument("--lora-modules", nargs="+", default=None)  # name=path (or JSON), as an export's README
    parser.add_argument("--served-model-name", nargs="+", default=None)
    return parser.parse_args(argv)


@contextlib.contextmanager
def serving(base: Path, args: list[str], env: dict[str, str]) -> Iterator[str]:
    """This fake with `vllm serve` flags `args` on a free loopback port, LoRA routes on and `env` added; yields its
    URL (`http://127.0.0.1:PORT/v1`) once it answers /health, and kills it on exit."""
    import httpx
    from server_fixtures import free_port

    port = free_port()
    command = [sys.executable, __file__, "serve", str(base), "--host", "127.0.0.1", "--port", str(port), *args]
    full_env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **env}
    process = subprocess.Popen(command, env=full_env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fake vLLM on port {port} did not start (exit code {process.poll()})")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.kill()
        process.wait()


def main(argv: list[str]) -> None:
    if os.environ.get("FAKE_VLLM_FAIL_START"):
        print("INFO loading model", flush=True)
        print(f"ERROR {os.environ['FAKE_VLLM_FAIL_START']}", file=sys.stderr, flush=True)
        sys.exit(1)
    args = parse(argv)
    _event("start", argv=argv)

    import uvicorn

    uvicorn.run(build_app(args), host=args.host, port=args.port, log_level="info")


def build_app(args: argparse.Namespace) -> Any:
    import threading

    import torch
    from fastapi import FastAPI, Query
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from peft import PeftModel
    from pydantic import BaseModel, ConfigDict, Field
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    base = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    state: dict[str, Any] = {"model": base, "asleep": False}
    adapters: dict[str, str] = {}  # lora_name -> PEFT adapter name inside the model
    counter = iter(range(1, 1_000_000))
    lock = threading.Lock()  # one generation or adapter change at a time
    processed = args.logprobs_mode == "processed_logprobs"
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()

    def error(message: str, kind: str, code: int) -> JSONResponse:  # vLLM's ErrorResponse
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, code)

    class CompletionRequest(BaseModel):  # the fields of vLLM 0.34's CompletionRequest the engine may send
        model_config = ConfigDict(extra="forbid")
        model: str | None = None
        prompt: list[Annotated[int, Field(ge=0)]]
        max_tokens: int | None = 16
        n: int = 1
        temperature: float | None = None
        top_p: float | None = None
        top_k: int | None = None
        min_p: float | None = None
        repetition_penalty: float | None = None
        presence_penalty: float | None = None
        frequency_penalty: float | None = None
        stop: str | list[str] | None = []
        stop_token_ids: list[int] | None = []
        seed: int | None = None
        logprobs: int | None = None
        return_tokens_as_token_ids: bool | None = None
        return_token_ids: bool | None = None
        stream: bool | None = False

    class LoadLoRAAdapterRequest(BaseModel):
        lora_name: str
        lora_path: str
        load_inplace: bool = False

    class UnloadLoRAAdapterRequest(BaseModel):
        lora_name: str
        lora_int_id: int | None = None

    app = FastAPI()

    @app.get("/health")
    def health() -> Response:
        return Response(status_code=200)

    @app.post("/v1/completions", response_model=None)
    def completions(request: CompletionRequest) -> Any:
        if request.model not in adapters:  # vLLM: a base model name would be served; the engine never sends one
            return error(f"The model `{request.model}` does not exist.", "NotFoundError", 404)
        if state["asleep"]:
            return error("the engine is sleeping", "ServiceUnavailableError", 503)
        if not request.stream:
            return error("this fake streams only (the engine always streams)", "BadRequestError", 400)
        _event("completion", model=request.model, fields=sorted(request.model_fields_set))
        return StreamingResponse(_stream(request), media_type="text/event-stream")

    def _stream(request: CompletionRequest) -> Any:
        stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        stop_ids = eos | set(request.stop_token_ids or [])
        temperature = 1.0 if request.temperature is None else request.temperature
        top_p = 1.0 if request.top_p is None else request.top_p
        created, cid = int(time.time()), f"cmpl-{os.getpid()}-{time.monotonic_ns()}"
        delay = float(os.environ.get("FAKE_VLLM_TOKEN_DELAY", "0"))
        for index in range(request.n):
            generator = torch.Generator()
            generator.manual_seed(request.seed + index if request.seed is not None else torch.seed())
            ids: list[int] = []
            text = ""
            for position in range(request.max_tokens or 16):
                with lock, torch.inference_mode():
                    model = state["model"]
                    if isinstance(model, PeftModel):
                        model.set_adapter(adapters[request.model])
                    logits = model(input_ids=torch.tensor([request.prompt + ids])).logits[0, -1].float()
                token, logprob = _sample(logits, temperature, top_p, generator)
                ids.append(token)
                full = tokenizer.decode(ids, skip_special_tokens=True)
                finish, reason = None, None
                if token in stop_ids:
                    finish, reason = "stop", (None if token in eos else token)
                elif any(s in full for s in stops):
                    finish, reason = "stop", next(s for s in stops if s in full)
                elif len(ids) == (request.max_tokens or 16):
                    finish = "length"
                choice: dict[str, Any] = {
                    "index": index,
                    "text": full[len(text) :],
                    "logprobs": {
                        "text_offset": [len(text)],
                        "token_logprobs": [logprob],
                        "tokens": [f"token_id:{token}"],
                        "top_logprobs": [{f"token_id:{token}": logprob}],
                    },
                    "finish_reason": finish,
                    "stop_reason": reason,
                    "token_ids": [token],
                }
                if position == 0:
                    choice["prompt_token_ids"] = request.prompt
                text = full
                chunk = {"id": cid, "object": "text_completion", "created": created, "model": request.model}
                yield f"data: {json.dumps({**chunk, 'choices': [choice]})}\n\n"
                if delay:
                    time.sleep(delay)
                if finish:
                    break
        yield "data: [DONE]\n\n"

    def _sample(logits: Any, temperature: float, top_p: float, generator: Any) -> tuple[int, float]:
        """vLLM's order: temperature (skipped when greedy), then top-p; logprobs raw or processed."""
        scaled = logits / temperature if temperature > 0 else logits
        if top_p < 1:
            probs, order = torch.softmax(scaled, -1).sort(descending=True)
            outside = (probs.cumsum(-1) - probs) >= top_p
            scaled = scaled.clone()
            scaled[order[outside]] = float("-inf")
        logprobs = torch.log_softmax(scaled if processed else logits, -1)
        if temperature <= 0:
            token = int(scaled.argmax())
        else:
            token = int(torch.multinomial(torch.softmax(scaled, -1), 1, generator=generator))
        return token, float(logprobs[token])

    if os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"):

        @app.post("/v1/load_lora_adapter", response_model=None)
        def load_lora_adapter(request: LoadLoRAAdapterRequest) -> Any:
            if request.lora_name in adapters and not request.load_inplace:
                message = f"The lora adapter '{request.lora_name}' has already been loaded."
                return error(message, "InvalidUserInput", 400)
            config_path = Path(request.lora_path) / "adapter_config.json"
            if not config_path.is_file():
                message = f"Loading lora {request.lora_name} failed: No adapter found for {request.lora_path}"
                return error(message, "NotFoundError", 404)
            rank = json.loads(config_path.read_text())["r"]
            reject = os.environ.get("FAKE_VLLM_REJECT")
            if rank > args.max_lora_rank or (reject and request.lora_name.endswith(reject)):
                return error(f"LoRA rank {rank} is greater than max_lora_rank {args.max_lora_rank}.", "Error", 500)
            internal = f"a{next(counter)}"
            with lock:
                if isinstance(state["model"], PeftModel):
                    state["model"].load_adapter(request.lora_path, adapter_name=internal)
                else:
                    state["model"] = PeftModel.from_pretrained(base, request.lora_path, adapter_name=internal).eval()
            adapters[request.lora_name] = internal
            _event("load", lora_name=request.lora_name, lora_path=request.lora_path)
            return Response(f"Success: LoRA adapter '{request.lora_name}' added successfully.", 200)

        @app.post("/v1/unload_lora_adapter", response_model=None)
        def unload_lora_adapter(request: UnloadLoRAAdapterRequest) -> Any:
            if request.lora_name not in adapters:
                return error(f"The lora adapter '{request.lora_name}' cannot be found.", "NotFoundError", 404)
            internal = adapters.pop(request.lora_name)
            if adapters:  # PEFT keeps at least one adapter; the last one just goes unnamed
                with lock:
                    state["model"].delete_adapter(internal)
            _event("unload", lora_name=request.lora_name)
            return Response(f"Success: LoRA adapter '{request.lora_name}' removed successfully.", 200)

    if os.environ.get("VLLM_SERVER_DEV_MODE", "").lower() in ("1", "true"):

        @app.post("/sleep")
        def sleep(level: Annotated[int, Query(ge=0, le=2)] = 1) -> Any:
            if not args.enable_sleep_mode:
                return error("Sleep mode is not enabled in the model config", "Error", 500)
            state["asleep"] = True
            _event("sleep", level=level)
            return {"status": "sleeping", "level": level}

        @app.post("/wake_up")
        def wake_up() -> Any:
            state["asleep"] = False
            _event("wake_up")
            return {"status": "awake", "tags": None}

        @app.get("/is_sleeping")
        def is_sleeping() -> Any:
            return {"is_sleeping": state["asleep"]}

    return app


if __name__ == "__main__":
    main(sys.argv[1:])
