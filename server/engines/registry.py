"""Which engine serves a model, and how each is loaded: `engine="auto"` resolved with the reason (also printed by
`art-agents doctor`). A new engine is a loader here and its name in `ModelConfig.engine`."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from art_agents.server.engines.protocol import Engine
from art_agents.server.engines.vllm_process import PYTHON_ENV, vllm_python
from art_agents.server.errors import ServiceError
from art_agents.server.models.lora_model import device_of
from art_agents.server.models.serving_precision import check_serving_dtype
from art_agents.train_config import ModelConfig

log = logging.getLogger("art_agents.server")

EngineLoader = Callable[[str, ModelConfig, str, Path], Engine]
"""(base_model, config, model name, model folder) -> a loaded engine."""


@dataclass(frozen=True)
class VLLMInstall:
    python: str
    version: str | None  # None: vLLM is not installed there
    problem: str | None = None  # why the python could not be asked


def find_vllm(python: str | None = None) -> VLLMInstall:
    """vLLM's version in the vLLM python, read from its metadata (importing vLLM takes many seconds)."""
    python = python or vllm_python()
    script = "import importlib.metadata as m\ntry: print(m.version('vllm'))\nexcept m.PackageNotFoundError: pass"
    try:
        done = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return VLLMInstall(python, None, f"{python} could not be run ({exc}); check {PYTHON_ENV} / --vllm-python")
    if done.returncode != 0:
        return VLLMInstall(python, None, f"{python} failed: {done.stderr.strip()[-500:]}")
    return VLLMInstall(python, done.stdout.strip() or None)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def choose_engine(config: ModelConfig) -> tuple[str, str]:
    """(engine, why): `auto` is vLLM where CUDA is available and vLLM is installed in the vLLM python."""
    if config.engine != "auto":
        return config.engine, f"engine={config.engine!r} was asked for"
    if config.vllm_server_url:
        return "vllm", f"the vLLM server at {config.vllm_server_url} (vllm_server_url) serves it"
    if config.vllm_nodes:
        return "vllm", f"vLLM on {1 + len(config.vllm_nodes)} nodes (vllm_nodes) serves it"
    if config.gguf_file:
        return "transformers", "a gguf_file is served by the transformers engine"
    if config.device.startswith("cpu"):
        return "transformers", f"device={config.device!r}"
    if not cuda_available():
        return "transformers", "no CUDA device (vLLM needs one)"
    install = find_vllm()
    if install.version is None:
        missing = install.problem or f"vLLM is not installed in {install.python}"
        return "transformers", f"{missing}; install it there or point {PYTHON_ENV} / --vllm-python at its python"
    return "vllm", f"CUDA is available and vLLM {install.version} is installed in {install.python}"


def _transformers(base_model: str, config: ModelConfig, name: str, model_dir: Path) -> Engine:
    from art_agents.server.engines.transformers_engine import TransformersEngine

    return TransformersEngine.load(base_model, config)


def _vllm(base_model: str, config: ModelConfig, name: str, model_dir: Path) -> Engine:
    from art_agents.server.engines.vllm_engine import VLLMEngine

    if not config.vllm_nodes:
        return VLLMEngine.load(base_model, config, name=name, model_dir=model_dir)
    from art_agents.server.engines.vllm_nodes import load_nodes

    return load_nodes(base_model, config, name=name, model_dir=model_dir)


def _scripted(base_model: str, config: ModelConfig, name: str, model_dir: Path) -> Engine:
    from art_agents.server.engines.scripted_engine import ScriptedEngine

    return ScriptedEngine.load(base_model, config)


ENGINES: dict[str, EngineLoader] = {"transformers": _transformers, "vllm": _vllm, "scripted": _scripted}


def load_engine(base_model: str, config: ModelConfig, name: str, model_dir: Path) -> Engine:
    """The engine for a model; `config.replicas` transformers engines, or one vLLM engine per node
    (`vllm_nodes`), behind a `ReplicaRouter` when more than one."""
    engine, why = choose_engine(config)
    log.info("model %s is served by the %s engine: %s", name, engine, why)
    check_serving_dtype(config, engine, device_of(config))
    if config.replicas == 1:
        return ENGINES[engine](base_model, config, name, model_dir)
    if engine != "transformers":
        raise ServiceError(
            400,
            f"replicas={config.replicas} is for the transformers engine, and this model is served by {engine}; "
            "vLLM serves copies of a model with data_parallel_size",
        )
    from art_agents.server.engines.replicas import ReplicaRouter

    return ReplicaRouter([ENGINES[engine](base_model, config, name, model_dir) for _ in range(config.replicas)])
