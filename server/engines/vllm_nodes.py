"""vLLM on several nodes (`ModelConfig.vllm_nodes`): one vLLM engine per node behind the server's `ReplicaRouter`.

Node 0's vLLM is the server's own (or `vllm_server_url`); every other node's is a vLLM server started there and
driven over HTTP as an external one is. The router is the one transformers replicas use, so nodes get its two
guarantees: a rollout's calls stay on one node (its prefix cache), and a checkpoint is loaded into every node
while all are paused, so no node serves a step another has not loaded. Checkpoint folders are read by every
node from the shared filesystem at the same path.
"""

from __future__ import annotations

from pathlib import Path

from art_agents.server.engines.protocol import Engine
from art_agents.server.engines.replicas import ReplicaRouter
from art_agents.server.engines.vllm_engine import VLLMEngine
from art_agents.train_config import ModelConfig


def load_nodes(base_model: str, config: ModelConfig, *, name: str, model_dir: Path) -> ReplicaRouter:
    """Node 0's engine, then one per `config.vllm_nodes` URL; a node that does not answer stops node 0's vLLM."""
    alone = config.model_copy(update={"vllm_nodes": []})
    first = VLLMEngine.load(base_model, alone, name=name, model_dir=model_dir)
    engines: list[Engine] = [first]
    try:
        for url in config.vllm_nodes:
            node = alone.model_copy(update={"vllm_server_url": url})
            engines.append(VLLMEngine.load(base_model, node, name=name, model_dir=model_dir))
    except BaseException:
        first.stop()
        raise
    return ReplicaRouter(engines)
