"""The training loop (`art.train_loop`): draw scenarios, gather groups, train, repeat.

`train` holds `train_loop` and the config-file job (`TrainJob`, `run_job`); `pipeline` the pipelined loop
(the next draws roll out while a step trains, paced to `max_steps_off_policy`); `draws` what the two share.
"""

from art_agents.jobs import TrainJob, load_function, load_scenarios
from art_agents.loop.draws import StepRecord
from art_agents.loop.train import run_job, train_loop

__all__ = ["StepRecord", "TrainJob", "load_function", "load_scenarios", "run_job", "train_loop"]
