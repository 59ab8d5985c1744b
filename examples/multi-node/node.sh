#!/usr/bin/env bash
# One node of an art-agents server that trains on several nodes (docs/scale-out.md, "Several nodes"): node 0 runs
# `art-agents serve` and hosts the trainer group's rendezvous; every other node runs `art-agents trainer-node`.
# The same script serves SkyPilot (examples/skypilot/nodes.yaml), SLURM and Kubernetes; the launcher sets
#   NODE_RANK   this node's number, 0 .. N-1              (SKYPILOT_NODE_RANK, SLURM_NODEID, JOB_COMPLETION_INDEX)
#   NODE0_ADDR  node 0's address as the other nodes see it (first of SKYPILOT_NODE_IPS, first host of the SLURM job,
#               the headless service name of pod 0)
#   ART_PATH    the server's folder, on a filesystem every node mounts at this same path (NFS, Lustre, a
#               ReadWriteMany volume; not gcsfuse/s3fs: the token store is SQLite and needs POSIX locks)
# and optionally RDZV_PORT (29400), PORT (8000), ART_ENV (the virtualenv with art-agents[server], ~/art-env) and
# VLLM_PYTHON (the python of vLLM's own virtualenv). Models then register with
# ModelConfig(trainer_processes=<GPUs per node for training>, trainer_nodes=N): the server passes its
# ART_TRAINER_RENDEZVOUS, set here, to the group.
set -euo pipefail
: "${NODE_RANK:?set NODE_RANK}" "${NODE0_ADDR:?set NODE0_ADDR}" "${ART_PATH:?set ART_PATH}"
RENDEZVOUS="$NODE0_ADDR:${RDZV_PORT:-29400}"
ART="${ART_ENV:-$HOME/art-env}/bin/art-agents"

if [ "$NODE_RANK" = 0 ]; then
  export ART_TRAINER_RENDEZVOUS="$RENDEZVOUS"
  exec "$ART" serve --host 0.0.0.0 --port "${PORT:-8000}" --art-path "$ART_PATH" \
    ${VLLM_PYTHON:+--vllm-python "$VLLM_PYTHON"}
fi
exec "$ART" trainer-node --rendezvous "$RENDEZVOUS" --node-rank "$NODE_RANK"
