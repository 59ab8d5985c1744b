"""W&B reporter: every train and log step of a model as one row of its W&B run, against the checkpoint step.

On with `TrainableModel(report_to=["wandb"])` or `ART_AGENTS_REPORT_TO=wandb` (see `art_agents.report.reporters`).
W&B's own variables apply: `WANDB_MODE=offline` writes the run under `WANDB_DIR` (default `./wandb`) with no
account, for `wandb sync` later; `WANDB_PROJECT` replaces the model's project, `WANDB_ENTITY` picks the entity.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import wandb
from wandb.sdk import wandb_setup

from art_agents.errors import ArtError

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

    from art_agents.model import TrainableModel
    from art_agents.report.reporters import StepRecord

# The x-axis of every chart. Logged as a value rather than wandb.log's `step=`, which must only grow: W&B drops a
# row whose `step=` is below one already logged, as after an evaluation at an older checkpoint or a resumed run.
STEP_METRIC = "training_step"


class WandbReporter:
    """One W&B run per model, started at its first step, so that registering alone makes no run.

    The run id is the model's name, so training resumed in a new process continues the same run (online).
    """

    def __init__(self, model: TrainableModel) -> None:
        _check_credentials()
        self._init_args: dict[str, Any] = {
            "project": os.environ.get("WANDB_PROJECT") or model.project,
            "name": model.name,
            "id": model.name,
            "resume": "allow",
            "reinit": "create_new",  # one run per model, beside any run of the user's own
            "config": {"base_model": model.base_model, **model.server_config.model_dump(mode="json")},
            # quiet: only where the run is (its URL, or the offline folder to `wandb sync`), warnings and errors;
            # console off: the process's stdout is the user's, not this model's run
            "settings": wandb.Settings(quiet=True, console="off"),
        }
        self._run: Run | None = None
        self._start_error: Exception | None = None

    def record(self, record: StepRecord) -> None:
        """Log the step's metrics (train ones as `train/<name>`), its reward histogram and, for train, its wall time."""
        if record.split == "train":
            row: dict[str, Any] = {f"train/{name}": value for name, value in record.metrics.items() if name != "step"}
            # a log call's span is only its upload (the rollouts ran before it); a train call's is the whole step
            row["train/step_wall_s"] = record.finished_at - record.started_at
        else:
            row = dict(record.metrics)  # already named <split>/...
        rewards = [trajectory.reward for group in record.groups for trajectory in group.trajectories]
        if rewards:
            row[f"{record.split}/reward_distribution"] = wandb.Histogram(rewards)
        self._started_run().log({STEP_METRIC: record.step, **row})

    def close(self) -> None:
        """Finish the run (offline: complete its folder for `wandb sync`); a later step starts it again."""
        if self._run is not None:
            run, self._run = self._run, None
            run.finish()

    def _started_run(self) -> Run:
        # A failed start is not retried: wandb.init can wait out its timeout (90 s) on every step otherwise.
        if self._start_error is not None:
            raise ArtError(f"the W&B run did not start ({self._start_error}); steps are not sent to W&B")
        if self._run is None:
            try:
                run = wandb.init(**self._init_args)
            except Exception as exc:
                self._start_error = exc
                raise
            run.define_metric(STEP_METRIC)
            run.define_metric("*", step_metric=STEP_METRIC)
            self._run = run
        return self._run


def _check_credentials() -> None:
    """Refuse online mode without credentials at registration, where wandb.init would prompt for a key or fail later.

    W&B's settings (environment and settings files) load here without starting its service process.
    """
    if wandb_setup.singleton().settings.mode in ("offline", "dryrun", "disabled"):
        return
    if not wandb.login(prompt=False, verify=False):
        raise ArtError(
            "report_to wandb: no W&B API key is configured; run `wandb login` (or set WANDB_API_KEY), "
            "or set WANDB_MODE=offline to write the run locally and upload it later with `wandb sync`"
        )
