"""`art-agents serve`, `doctor`, `tiny-model`, `quickstart`, `export` (in server/export/command.py) and `trainer-node`
(in trainer_node_command.py)."""

from __future__ import annotations

import errno
import ipaddress
import shlex
import socket
from pathlib import Path
from typing import Annotated

import typer

from art_agents.backends.local import DEFAULT_ART_PATH
from art_agents.extras import require_extra
from art_agents.server.export.command import export
from art_agents.server.host.cpu_threads import THREADS_ENV, use_cpu_threads
from art_agents.server.ops.quickstart import ROLLOUTS_PER_GROUP
from art_agents.server.ops.trainer_node_command import trainer_node
from art_agents.wire import RegisterRequest

LOOPBACK_NAMES = {"localhost"}
QUICKSTART_STEPS = 20


VLLMPython = Annotated[
    str | None,
    typer.Option(envvar="ART_VLLM_PYTHON", help="Python of the virtualenv vLLM is installed in (default: this one)."),
]


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Serving beyond this machine without a key would hand anyone the training routes."""
    if not is_loopback(host) and not api_key:
        raise ValueError(
            f"refusing to bind {host} without an API key: anyone who can reach it could train and replace the model; "
            "pass --api-key (or set ART_AGENTS_API_KEY), or bind 127.0.0.1"
        )


def check_port(host: str, port: int) -> None:
    """Bind the port once, as uvicorn will, before minutes of loading: a port in use fails now, naming the flag."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # uvicorn's option: TIME_WAIT is no conflict
            probe.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ValueError(
                f"port {port} on {host} is already in use; stop what listens there or pass another --port"
            ) from exc
        raise ValueError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); check --host and --port") from exc


def serve(
    art_path: Annotated[
        Path, typer.Option(help="Folder with the models, checkpoints and token stores.")
    ] = DEFAULT_ART_PATH,
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback needs --api-key.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 8000,
    api_key: Annotated[
        str | None, typer.Option(envvar="ART_AGENTS_API_KEY", help="Bearer token clients must send.")
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="debug, info, warning or error (the server's and uvicorn's).")
    ] = "info",
    model_dir: Annotated[
        list[Path] | None,
        typer.Option(
            help="Folder base models may be loaded from (repeatable); hub ids always load. Default: any folder "
            "on loopback, none (hub ids only) on any other host."
        ),
    ] = None,
    exit_with_parent: Annotated[
        int | None, typer.Option(help="Shut down when the process with this pid exits (LocalBackend sets it).")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Register this model name at start-up (with --base-model), as clients would.")
    ] = None,
    base_model: Annotated[
        str | None, typer.Option(help="Hub id or local folder of --model's base model (a new model's step 0).")
    ] = None,
    project: Annotated[str, typer.Option(help="Project folder of --model under --art-path.")] = "default",
    vllm_python: VLLMPython = None,
    cpu_threads: Annotated[
        int | None,
        typer.Option(
            envvar=THREADS_ENV,
            min=1,
            help="torch CPU threads for serving and training (default: one per core); on a machine shared with "
            "other work, the cores left free.",
        ),
    ] = None,
) -> None:
    """Serve the OpenAI-compatible API and the training routes."""
    require_extra("server", purpose="art-agents serve", load=False)
    _use_vllm_python(vllm_python)
    try:
        check_bind(host, api_key)
        check_port(host, port)
        serve_models = _start_up_models(model, base_model, project)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    import logging

    import uvicorn

    from art_agents.server.http.app import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if exit_with_parent is not None:
        from art_agents.server.host.processes import exit_with_parent as watch_parent

        watch_parent(exit_with_parent)
    use_cpu_threads(cpu_threads)
    folders = model_dir if model_dir or not is_loopback(host) else None
    app = create_app(art_path, api_key=api_key, model_dirs=folders, serve_models=serve_models)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


def _start_up_models(model: str | None, base_model: str | None, project: str) -> list[RegisterRequest]:
    """`--model` with `--base-model`, checked before the server loads anything (a wrong path fails in seconds)."""
    if model is None and base_model is None:
        return []
    if model is None or base_model is None:
        raise ValueError("--model and --base-model go together: --model NAME --base-model PATH_OR_HUB_ID")
    from art_agents.names import check_safe_name
    from art_agents.server.errors import ServiceError
    from art_agents.server.models.model_sources import ModelSources

    check_safe_name(model, "--model")
    check_safe_name(project, "--project")
    try:
        ModelSources.find(base_model)
    except ServiceError as exc:
        raise ValueError(exc.detail) from exc
    return [RegisterRequest(name=model, project=project, base_model=base_model)]


def _use_vllm_python(python: str | None) -> None:
    """The vLLM engine reads the python from the environment (a setting of the server, never of a client)."""
    if python:
        import os

        from art_agents.server.engines.vllm_process import PYTHON_ENV

        os.environ[PYTHON_ENV] = python


def doctor(
    vllm_python: VLLMPython = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="A model folder or hub id: which family its chat template is, how tools render, which parser reads "
            "its replies, and what is known not to work with it."
        ),
    ] = None,
) -> None:
    """Print which engine `engine="auto"` will use and why: CUDA, vLLM and the versions of the stack; with --model,
    what the server does with that model's chat format."""
    require_extra("server", purpose="art-agents doctor", load=False)
    import importlib.metadata
    import sys

    import torch

    from art_agents.server.engines.registry import choose_engine, find_vllm
    from art_agents.train_config import ModelConfig

    _use_vllm_python(vllm_python)
    typer.echo(f"python        {sys.executable} ({sys.version.split()[0]})")
    for package in ("art-agents", "torch", "transformers", "peft", "trl", "accelerate"):
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        typer.echo(f"{package:<13} {version}")
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        typer.echo(f"CUDA          {torch.version.cuda}: {names}")
    else:
        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        typer.echo(f"CUDA          not available (torch {torch.__version__}, {build})")
    install = find_vllm()
    found = install.version or install.problem or "not installed"
    typer.echo(f"vLLM          {found} (in {install.python})")
    engine, why = choose_engine(ModelConfig())
    typer.echo(f"engine=auto   {engine}: {why}")
    if model is not None:
        _doctor_model(model)


def _doctor_model(base_model: str) -> None:
    from art_agents.server.errors import ServiceError
    from art_agents.server.models.lora_model import load_tokenizer
    from art_agents.server.models.model_family import family_report
    from art_agents.server.models.model_sources import ModelSources
    from art_agents.train_config import ModelConfig

    try:
        ModelSources.find(base_model)
        tokenizer = load_tokenizer(base_model, ModelConfig())
    except ServiceError as exc:
        raise typer.BadParameter(exc.detail, param_hint="--model") from exc
    except Exception as exc:
        raise typer.BadParameter(ModelSources.load_error(base_model), param_hint="--model") from exc
    report = family_report(tokenizer, _model_type(base_model))
    typer.echo(f"model         {base_model}")
    typer.echo(f"family        {report.family}")
    if report.renders is not None:
        parts = ", ".join(
            f"{part} {'natively' if ok else 'through the hermes fallback'}"
            for part, ok in (("tools", report.renders.tools), ("calls", report.renders.calls),
                             ("results", report.renders.results))
        )  # fmt: skip
        typer.echo(f"tools         {parts}")
    typer.echo(f"replies       parsed by {report.parser}")
    for note in report.notes:
        typer.echo(f"note          {note}")


def _model_type(base_model: str) -> str | None:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(base_model).model_type
    except Exception:  # a GGUF folder, say: the template alone names the family
        return None


def tiny_model(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="Folder to write the model into.")],
    arch: Annotated[str, typer.Option(help="qwen3 or llama.")] = "qwen3",
    seed: Annotated[int, typer.Option(help="Seed of the random weights (the same seed builds the same model).")] = 0,
) -> None:
    """Build the tiny random model + BPE tokenizer + tool-capable chat template used by tests and the quickstart."""
    require_extra("server", purpose="art-agents tiny-model", load=False)
    from art_agents.server.ops.tiny_model import build_tiny_model

    if arch not in ("qwen3", "llama"):
        raise typer.BadParameter("--arch must be qwen3 or llama")
    typer.echo(str(build_tiny_model(path, arch, seed=seed)))  # type: ignore[arg-type]


def quickstart(
    steps: Annotated[
        int, typer.Option(help="Train until the model's checkpoint reaches this step.")
    ] = QUICKSTART_STEPS,
    art_path: Annotated[
        Path, typer.Option(help="Server folder (the quickstart's model lives in quickstart/ inside it).")
    ] = DEFAULT_ART_PATH,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Delete the quickstart's earlier checkpoints and start at step 0.")
    ] = False,
    rollouts: Annotated[
        int, typer.Option(help="Rollouts per prompt each round; more make a round without reward spread rarer.")
    ] = ROLLOUTS_PER_GROUP,
) -> None:
    """Train the tiny model offline on a toy reward and print the reward going up; a rerun continues."""
    require_extra("server", purpose="art-agents quickstart", load=False)
    from art_agents.cli.main import run_job
    from art_agents.server.ops.quickstart import model_folder, train_quickstart

    def interrupted() -> str:
        from art_agents.server.storage.checkpoints import latest_step

        again = quickstart_again(steps, art_path, rollouts)
        step = latest_step(model_folder(art_path))
        if not step:  # none yet, or only the untrained step 0
            return f"nothing was trained yet; `{again}` starts the run"
        return f"checkpoint {step} is saved in {model_folder(art_path)}; rerun `{again}` to continue"

    run_job(lambda: train_quickstart(steps, art_path, fresh=fresh, rollouts=rollouts), interrupted)


def quickstart_again(steps: int, art_path: Path, rollouts: int) -> str:
    """The command that carries on a quickstart run: its flags that differ from the defaults, less `--fresh`
    (which would start it over)."""
    flags = [
        *(["--steps", str(steps)] if steps != QUICKSTART_STEPS else []),
        *(["--art-path", str(art_path)] if art_path != DEFAULT_ART_PATH else []),
        *(["--rollouts", str(rollouts)] if rollouts != ROLLOUTS_PER_GROUP else []),
    ]
    return shlex.join(["art-agents", "quickstart", *flags])


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("doctor")(doctor)
    app.command("tiny-model")(tiny_model)
    app.command("quickstart")(quickstart)
    app.command("export")(export)
    app.command("trainer-node")(trainer_node)
