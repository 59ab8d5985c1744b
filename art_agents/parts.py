"""The one seam where the core reaches the parts above it: the server, the integrations and autorl.

The core imports none of them (they import the core). What it starts of theirs is named here as
"module:attribute" and imported at first use, so `import art_agents` stays light, the core works
without their extras, and every reach upward can be read in this one file.
"""

from __future__ import annotations

import importlib
from typing import Any

# `LocalBackend(in_process=True)` serves this app in a thread (as a child process it runs `art-agents serve`).
SERVER_APP = "art_agents.server.http.app:create_app"
# `TrainableModel.export()`: a checkpoint of a LocalBackend's model written out by the server's export (in this
# process: it needs torch and PEFT, which LocalBackend's `server` extra installs, and the checkpoints on this disk).
EXPORT = "art_agents.server.export.writer:export_model"
# `art-agents eval RUN_FOLDER`: the kind of run a folder holds (its task.json says which) -> the context manager that
# gives its held-out split, its own rollout and its model.
RUN_EVALUATIONS = {
    "autorl": "art_agents.autorl.run_eval:run_evaluation",
    "mcp-rl": "art_agents.autorl.run_eval:run_evaluation",
    "quickstart": "art_agents.server.ops.quickstart_eval:run_evaluation",
}
# `Model.chat_model()`: a LangChain ChatOpenAI whose calls are captured (the `langgraph` extra).
CHAT_MODEL = "art_agents.integrations.langgraph:chat_model"
# `report_to` name -> the Reporter class that takes the model; each needs the extra of the same name.
REPORTERS = {
    "wandb": "art_agents.integrations.wandb_metrics:WandbReporter",
    "langfuse": "art_agents.integrations.langfuse_traces:LangfuseReporter",
    "openpipe": "art_agents.integrations.openpipe_reporting:OpenPipeReporter",  # httpx only: no extra
}
# The `register(app)` of each part that adds `art-agents` subcommands, with the hint shown when it cannot load.
CLI_PARTS = {
    "art_agents.server.ops.cli:register": "serve, doctor, tiny-model, export, trainer-node (extra: server)",
    "art_agents.report.command:register": "report",
    "art_agents.cli.train:register": "train",
    "art_agents.evaluation.command:register": "eval",
    "art_agents.autorl.cli:register": "autorl, mcp-rl",
}


def load(target: str) -> Any:
    """The attribute that `target` ("module:attribute") names; ImportError when its module or extra is missing."""
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)
