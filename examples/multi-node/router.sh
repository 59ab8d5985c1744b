#!/usr/bin/env bash
# A trained model served from one vLLM per node behind vLLM's own router (`pip install vllm-router`, 0.1.17 checked),
# which keeps every call of one session on one vLLM (its prefix cache holds the session's earlier turns).
# docs/scale-out.md, "Several nodes"; not run here (no GPUs). On every node, the adapter exported to a folder all
# nodes see (`art-agents export MODEL_DIR --to /shared/NAME`), TP x DP inside the node:
#   vllm serve BASE --enable-lora --max-lora-rank 64 --lora-modules NAME=/shared/NAME \
#     --tensor-parallel-size 4 --data-parallel-size 2 --port 8001
# then on one node:  WORKER_URLS="http://node0:8001 http://node1:8001" bash examples/multi-node/router.sh
# Clients send `X-Session-ID: <rollout or conversation id>`: consistent_hash routes on it (without it, on the
# request's own ids, so every call may land elsewhere).
set -euo pipefail
: "${WORKER_URLS:?set WORKER_URLS to the nodes' vLLM URLs, space-separated}"
# shellcheck disable=SC2086  # one URL per word
exec "${ROUTER:-vllm-router}" --host 0.0.0.0 --port "${ROUTER_PORT:-8000}" --policy consistent_hash \
  --worker-urls $WORKER_URLS ${ROUTER_API_KEY:+--api-key "$ROUTER_API_KEY"}
