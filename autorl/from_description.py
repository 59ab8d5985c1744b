"""AutoRL: from a task in words to a trained model, with no data.

`run_autorl(config)` is the whole pipeline behind `art-agents autorl`: generate the task's system
prompt, rubric, training inputs and held-out eval inputs (or reuse the saved ones), evaluate the
base model, then train with RULER rewards by the rubric while a curriculum retires inputs that
teach nothing and generates new ones, evaluating every `eval_every` steps: the judge's score and a
side-by-side win rate against the base model's answers. Everything lives in the run folder, so
rerunning the same command resumes at the last saved step without generating anything again.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, field_validator

from art_agents.autorl.curriculum import Curriculum, PoolInput
from art_agents.autorl.eval_settings import EvalSettings
from art_agents.autorl.generation import Generated, Generation, GenerationError
from art_agents.autorl.run_config import RunConfig, RunSummary, registered_model
from art_agents.autorl.run_eval import held_out_evaluation
from art_agents.autorl.run_folder import EVAL_FILE, RUBRIC_FILE, SYSTEM_PROMPT_FILE, RunFolder
from art_agents.autorl.scoring import GroupScorer
from art_agents.autorl.task_data import (
    InputDraft,
    TaskInput,
    TaskSetup,
    generate_inputs,
    generate_setup,
    number_inputs,
)
from art_agents.autorl.text_rollout import TextRolloutConfig, text_rollout
from art_agents.evaluation.run import Evaluation
from art_agents.llm import Answer, LLMCall
from art_agents.loop.train import StepRecord, train_loop
from art_agents.model import TrainableModel
from art_agents.schema import Schema
from art_agents.trajectory import TrajectoryGroup

Echo = Callable[[str], None]
Spent = TypeVar("Spent", bound=Answer[TaskSetup] | Generated[InputDraft])
INPUTS_FILE, STEPS_FILE = "inputs.jsonl", "steps.jsonl"
UNPRICED = "False when LiteLLM has no price for the judge: its cost then counts as 0, which is not what it cost."


class AutoRLConfig(RunConfig):
    """An AutoRL run; the TOML form of `art-agents autorl` uses these names."""

    task: str = Field(description="What the model should learn to do, in plain words.")
    name: str = "autorl-agent"
    project: str = "autorl"
    inputs: int = Field(32, ge=1, description="Training inputs in the pool (kept full by the curriculum).")
    eval_inputs: int = Field(12, ge=1, description="Held-out inputs, never trained on.")
    eval_every: int = Field(5, ge=1, description="Evaluate every this many steps (and after the last).")
    retire_after: int = Field(2, ge=1, description="Draws without a reward spread before an input is retired.")
    rollout: TextRolloutConfig = Field(default_factory=TextRolloutConfig)
    system_prompt: str | None = Field(None, description="Use this instead of a generated system prompt.")
    rubric: str | None = Field(None, description="Use this instead of a generated rubric.")
    out: Path = Field(Path("autorl-run"), description="Run folder: task, inputs, rubric, evaluations, checkpoints.")

    @field_validator("task")
    @classmethod
    def _described(cls, task: str) -> str:
        if len(task.split()) < 3:
            raise ValueError(
                "the task description is empty or too short to generate from: describe the task in a sentence "
                "or more (--task 'Summarise support emails in two sentences...' or --task-file task.md)"
            )
        return task.strip()


class TaskData(Schema):
    """A run's generated data, as saved in its folder."""

    setup: TaskSetup
    pool: list[PoolInput]
    eval_inputs: list[TaskInput]
    generation: Generation | None = None


class StepRow(Schema):
    """One line of `steps.jsonl`: a train call and what the curriculum and the judges did after it."""

    step: int
    advanced: bool
    reward_mean: float
    rollouts: int
    retired: int
    added: int
    pool: int
    judge_prompt_tokens: int
    judge_completion_tokens: int
    judge_cost_usd: float
    judge_cost_known: bool = Field(True, description=UNPRICED)
    generator_prompt_tokens: int
    generator_completion_tokens: int
    generator_cost_usd: float
    generator_cost_known: bool = Field(True, description="False when LiteLLM has no price for the generator.")


class AutoRLSummary(RunSummary):
    steps: list[StepRow] = Field(default_factory=list, description="Train calls of this invocation.")


def _task(config: AutoRLConfig) -> dict[str, Any]:
    """What identifies the run: a rerun with other values here is another run."""
    return {
        "kind": "autorl",
        "task": config.task,
        "base_model": config.base_model,
        "name": config.name,
        "project": config.project,
    }


class _Ledger:
    """The generator's running cost, saved to `generation.json` after every request batch."""

    def __init__(self, folder: RunFolder, config: AutoRLConfig) -> None:
        self.folder, self.config = folder, config
        saved = folder.read_json("generation.json", Generation)
        self.total = saved or Generation(generator_model=config.generator_model or config.judge_model or "")

    def generator(self) -> tuple[str, dict[str, Any]]:
        return self.config.generation_params()

    async def record(self, job: Awaitable[Spent]) -> Spent:
        """`job`'s result, its requests added to the total (also those of a generation that failed)."""
        try:
            result = await job
        except GenerationError as exc:
            self._add(exc.calls)
            raise
        self._add(result.calls, getattr(result, "duplicates_dropped", 0))
        return result

    def _add(self, calls: Sequence[LLMCall], duplicates_dropped: int = 0) -> None:
        self.total = self.total.plus(calls, duplicates_dropped)
        self.folder.write_json("generation.json", self.total)


async def prepare_task(config: AutoRLConfig, folder: RunFolder, echo: Echo = print) -> TaskData:
    """The saved task data, generating only what is missing; each file is written once it is complete.

    The system prompt and rubric are markdown files: edit them after `--dry-run` and the run uses them.
    """
    ledger = _Ledger(folder, config)
    system_prompt = config.system_prompt or folder.read_text(SYSTEM_PROMPT_FILE)
    rubric = config.rubric or folder.read_text(RUBRIC_FILE)
    if system_prompt is None or rubric is None:
        generator, params = ledger.generator()
        echo(f"writing the system prompt and rubric with {generator}")
        answer = await ledger.record(generate_setup(generator, config.task, litellm_params=params))
        system_prompt = system_prompt or answer.value.system_prompt
        rubric = rubric or answer.value.rubric
    folder.write_text(RUBRIC_FILE, rubric + "\n")
    folder.write_text(SYSTEM_PROMPT_FILE, system_prompt + "\n")

    eval_inputs = folder.read_jsonl(EVAL_FILE, TaskInput)
    if eval_inputs is None:
        generator, params = ledger.generator()
        echo(f"generating {config.eval_inputs} held-out inputs with {generator}")
        drafts = await ledger.record(generate_inputs(generator, config.task, config.eval_inputs, litellm_params=params))
        eval_inputs = number_inputs(drafts.items, "e", 0)
        folder.write_jsonl(EVAL_FILE, eval_inputs)
    else:
        echo(f"reusing {len(eval_inputs)} held-out inputs from {folder.file(EVAL_FILE)}")

    pool = folder.read_jsonl(INPUTS_FILE, PoolInput)
    if pool is None:
        generator, params = ledger.generator()
        echo(f"generating {config.inputs} training inputs with {generator}")
        held_out = [i.input for i in eval_inputs]
        drafts = await ledger.record(
            generate_inputs(generator, config.task, config.inputs, existing=held_out, litellm_params=params)
        )
        pool = [PoolInput(**item.model_dump()) for item in number_inputs(drafts.items, "i", 0)]
        folder.write_jsonl(INPUTS_FILE, pool)
    else:
        echo(f"reusing {len(pool)} training inputs from {folder.file(INPUTS_FILE)}")
    return TaskData(
        setup=TaskSetup(system_prompt=system_prompt, rubric=rubric),
        pool=pool,
        eval_inputs=eval_inputs,
        generation=ledger.total,
    )


async def prepare_run(config: AutoRLConfig, *, fresh: bool = False, echo: Echo = print) -> tuple[RunFolder, TaskData]:
    """The run folder claimed for this task, and its data (saved, or generated now).

    The folder and the judge's and generator's keys are checked before anything is written."""
    folder = RunFolder(config.out)
    folder.check(_task(config), fresh=fresh)
    config.check_keys(judge=True, generator=True)
    if folder.claim(_task(config), fresh=fresh):
        echo(f"resuming the run in {folder.path}")
    try:
        data = await prepare_task(config, folder, echo)
    except GenerationError as exc:
        raise exc.saved(folder.saved()) from exc
    settings = EvalSettings.of(
        config, _eval_rollout(config), rubric=data.setup.rubric, system_prompt_file=SYSTEM_PROMPT_FILE
    )
    settings.save(folder)  # what `art-agents eval RUN_FOLDER` evaluates with
    return folder, data


def _eval_rollout(config: AutoRLConfig) -> TextRolloutConfig:
    return config.rollout.model_copy(update={"temperature": config.eval_temperature})


async def run_autorl(config: AutoRLConfig, *, fresh: bool = False, echo: Echo = print) -> AutoRLSummary:
    """The whole AutoRL pipeline; resumes from the run folder when it holds this run."""
    if config.judge_model is None:
        raise ValueError("AutoRL scores attempts with a judge: give --judge-model (any LiteLLM model string)")
    folder, data = await prepare_run(config, fresh=fresh, echo=echo)
    run = _Run(config, folder, data, echo)
    async with registered_model(config, folder) as model:
        step = await model.get_step()
        await run.evaluation(model, 0)
        if step and (step % config.eval_every == 0 or step >= config.steps):
            await run.evaluation(model, step)  # an evaluation the previous invocation did not finish
        if step < config.steps:
            if step:
                echo(f"continuing at step {step} of {config.steps}")
            await train_loop(
                model,
                functools.partial(text_rollout, system_prompt=data.setup.system_prompt, config=config.rollout),
                run.curriculum,
                steps=config.steps - step,
                after_each=run.scorer,
                after_train=functools.partial(run.after_train, model),
                **config.loop_options(),
            )
        step = await model.get_step()
        final = await run.evaluation(model, step)
    summary = AutoRLSummary(
        out=folder.path,
        step=step,
        evaluation=final.summary,
        steps=run.rows,
        judge_cost_usd=run.scorer.cost_usd,
        judge_cost_known=run.scorer.cost_known,
        judge_prompt_tokens=run.scorer.prompt_tokens,
        judge_completion_tokens=run.scorer.completion_tokens,
        generation=folder.read_json("generation.json", Generation),
    )
    folder.write_json("summary.json", summary)
    return summary


class _Run:
    """The state one invocation carries between train calls: curriculum updates, evaluations, step rows."""

    def __init__(self, config: AutoRLConfig, folder: RunFolder, data: TaskData, echo: Echo) -> None:
        self.config, self.folder, self.data, self.echo = config, folder, data, echo
        self.ledger = _Ledger(folder, config)
        self.curriculum = Curriculum(data.pool, retire_after=config.retire_after, seed=config.seed)
        self.scenarios: dict[str, TaskInput] = {**self.curriculum.by_id(), **{i.id: i for i in data.eval_inputs}}
        self.scorer = GroupScorer(
            self.scenarios,
            judge_model=config.judge_model,
            rubric=data.setup.rubric,
            judge_params=config.judge_params,
            hints=config.ruler_hints,
        )
        self.rows: list[StepRow] = []
        self.held_out = held_out_evaluation(
            folder, config, data.eval_inputs, self.scorer, _eval_rollout(config), system_prompt=data.setup.system_prompt
        )
        self.judge_mark = self._mark()

    async def evaluation(self, model: TrainableModel, step: int) -> Evaluation:
        """Step 0 against `step` on the held-out inputs, as `art-agents eval RUN_FOLDER` evaluates them."""
        evaluation = await self.held_out.steps(model, sorted({0, step}))
        last = evaluation.summary.models[-1]
        versus = next((c.judged for c in evaluation.summary.comparisons if c.judged is not None), None)
        won = f", win rate vs base {versus.win_rate:.3f}" if versus and versus.win_rate is not None else ""
        self.echo(f"eval at step {step}: judge score {last.mean_reward or 0.0:.3f}{won}")
        self.judge_mark = self._mark()  # evaluations report their own judge cost, not the next step's row
        return evaluation

    def _mark(self) -> tuple[int, int, float]:
        return self.scorer.prompt_tokens, self.scorer.completion_tokens, self.scorer.cost_usd

    async def after_train(self, model: TrainableModel, record: StepRecord, groups: list[TrajectoryGroup]) -> None:
        """Retire inputs that taught nothing, generate their replacements, log the step, evaluate when due.

        The row is written before the evaluation, so a run killed while evaluating keeps it; its judge
        figures are this draw's training groups (evaluations report their own cost).
        """
        judge = [now - before for now, before in zip(self._mark(), self.judge_mark, strict=True)]
        self.judge_mark = self._mark()
        generator_before = self.ledger.total
        self.curriculum.observe(groups)
        retired, added = await self._refresh(record.step)
        self.folder.write_jsonl(INPUTS_FILE, self.curriculum.pool)
        generator = self.ledger.total
        row = StepRow(
            step=record.step,
            advanced=record.advanced,
            reward_mean=record.reward_mean,
            rollouts=record.rollouts,
            retired=retired,
            added=added,
            pool=len(self.curriculum.active),
            judge_prompt_tokens=int(judge[0]),
            judge_completion_tokens=int(judge[1]),
            judge_cost_usd=judge[2],
            judge_cost_known=self.scorer.cost_known,
            generator_prompt_tokens=generator.prompt_tokens - generator_before.prompt_tokens,
            generator_completion_tokens=generator.completion_tokens - generator_before.completion_tokens,
            generator_cost_usd=generator.cost_usd - generator_before.cost_usd,
            generator_cost_known=generator.cost_known,
        )
        self.rows.append(row)
        self.folder.append_jsonl(STEPS_FILE, row)
        state = f"step {row.step}" if row.advanced else f"step {row.step} (no reward spread: nothing trained)"
        self.echo(
            f"{state}: reward {row.reward_mean:.3f} over {row.rollouts} rollouts; "
            f"inputs retired {row.retired}, added {row.added}, pool {row.pool}"
        )
        if record.advanced and (record.step % self.config.eval_every == 0 or record.step >= self.config.steps):
            await self.evaluation(model, record.step)

    async def _refresh(self, step: int) -> tuple[int, int]:
        """Replace the inputs due for retirement with new ones; on a generator failure keep them and go on."""
        due = self.curriculum.due()
        if not due:
            return 0, 0
        generator, params = self.ledger.generator()
        existing = [e.input for e in self.curriculum.pool] + [i.input for i in self.data.eval_inputs]
        try:
            drafts = await self.ledger.record(
                generate_inputs(
                    generator,
                    self.config.task,
                    len(due),
                    existing=existing,
                    focus=self.curriculum.focus(),
                    litellm_params=params,
                )
            )
        except GenerationError as exc:
            self.echo(f"warning: kept {len(due)} inputs without signal, no replacements could be generated: {exc}")
            return 0, 0
        self.curriculum.retire(due, step)
        fresh = [PoolInput(**i.model_dump()) for i in number_inputs(drafts.items, "i", len(self.curriculum.pool), step)]
        self.curriculum.add(fresh)
        self.scenarios.update({item.id: item for item in fresh})
        return len(due), len(fresh)
