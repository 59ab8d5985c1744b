"""Supervised fine-tuning on the tiny model: assistant-only masks, falling loss, the SFT'd adapter served as
`name@N+1`, one lineage with RL steps, and bad input (or weights that cannot serve) refused without losing the
served checkpoint."""

from __future__ import annotations

import collections
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from scripted_openai import ScriptedOpenAI
from server_fixtures import ADD_TOOL

import art_agents as art
from art_agents.distill import keep_best
from art_agents.errors import ArtError, ServerError
from art_agents.local import LocalBackend
from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG
from art_agents.server.storage.token_store import TokenStore
from art_agents.server.training.sequences import Policy, TrainingInputError, sft_sequences
from art_agents.utils.sft import create_lr_schedule, create_sft_dataset_iterator, iterate_file, train_sft_from_file
from art_agents.wire import TrainEvent, TrainSFTEvent

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
REPLY = "Zorbia's capital is Quuxtown."


def tool_conversation() -> art.Trajectory:
    return art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "You add numbers with the tool."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "4"},
            {"role": "assistant", "content": "It is 4."},
        ],
        tools=[ADD_TOOL],
    )


def demonstration(question: str = "What is the capital of Zorbia?", reply: str = REPLY) -> art.Trajectory:
    return art.Trajectory(
        messages_and_choices=[{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
    )


@pytest.mark.parametrize(("last_only", "trained"), [(False, ["tool_call", "It is 4."]), (True, ["It is 4."])])
def test_only_assistant_tokens_carry_loss(
    tokenizer: Any, store: TokenStore, last_only: bool, trained: list[str]
) -> None:
    sequences, stats = sft_sequences([tool_conversation()], store, tokenizer, Policy("m", 0), last_only)
    header = tokenizer.encode("<|im_start|>assistant\n")
    assert stats.turns_retokenized == len(trained) and len(sequences) == len(trained)
    for sequence, expected in zip(sequences, trained, strict=True):
        ids = sequence.token_ids
        starts = [i for i in range(len(ids)) if ids[i : i + len(header)] == header]
        reply_start = starts[-1] + len(header)  # the reply: everything after the last assistant header
        assert sequence.mask == [i >= reply_start for i in range(len(ids))]  # token by token
        reply = tokenizer.decode(ids[reply_start:])
        assert expected in reply and reply.endswith("<|im_end|>")
        context = tokenizer.decode(ids[:reply_start])
        assert "What is 2+2?" in context and "Add two integers." in context  # the prompt and the tools: no loss
    if not last_only:
        assert "<tool_response>\n4\n</tool_response>" in tokenizer.decode(sequences[1].token_ids)  # result masked


def with_worked_example(weight: int | None) -> art.Trajectory:
    """A worked example exchange in the prompt, then the task and the reply to imitate; `weight` on the example."""
    example = {"role": "assistant", "content": "Worked example: the capital of Blorb is Fooville."}
    return art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "What is the capital of Blorb?"},
            example if weight is None else {**example, "weight": weight},
            {"role": "user", "content": "What is the capital of Zorbia?"},
            {"role": "assistant", "content": REPLY},
        ]
    )


def test_a_worked_example_marked_weight_0_is_context_not_trained(tokenizer: Any, store: TokenStore) -> None:
    marked = art.Trajectory.model_validate_json(with_worked_example(0).model_dump_json())  # as the wire carries it
    assert marked.messages[1].weight == 0 and "weight" not in marked.messages()[1]  # chat endpoints never see it
    (sequence,), stats = sft_sequences([marked], store, tokenizer, Policy("m", 0))
    trained = tokenizer.decode([t for t, m in zip(sequence.token_ids, sequence.mask, strict=True) if m])
    assert stats.turns_retokenized == 1 and REPLY in trained and "Fooville" not in trained
    assert "Fooville" in tokenizer.decode(sequence.token_ids)  # still in the prompt, as context
    (alone,), _ = sft_sequences([demonstration()], store, tokenizer, Policy("m", 0))
    assert sequence.trained_tokens == alone.trained_tokens  # the reply's tokens, nothing of the example
    (last,), _ = sft_sequences([marked], store, tokenizer, Policy("m", 0), last_only=True)
    assert last.token_ids == sequence.token_ids and last.mask == sequence.mask  # the last message not marked 0
    unmarked, _ = sft_sequences([with_worked_example(None)], store, tokenizer, Policy("m", 0))
    assert sum(s.trained_tokens for s in unmarked) > sequence.trained_tokens  # unmarked, the example trains too
    with pytest.raises(TrainingInputError, match=r"trajectories\[0\].*all marked weight 0"):
        only_context = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello.", "weight": 0}]
        sft_sequences([art.Trajectory(messages_and_choices=only_context)], store, tokenizer, Policy("m", 0))
    with pytest.raises(ValueError, match=r"(?s)messages\[0\].*only assistant messages carry a training weight"):
        art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi", "weight": 0}])


def test_a_trajectory_without_an_assistant_reply_is_named(tokenizer: Any, store: TokenStore) -> None:
    question = art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}])
    with pytest.raises(TrainingInputError, match=r"trajectories\[1\].*no assistant message.*add the reply"):
        sft_sequences([demonstration(), question], store, tokenizer, Policy("m", 0))


@pytest.fixture(scope="module")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(path=tmp_path_factory.mktemp("sft") / ".art", in_process=True)
    yield backend
    await backend.close()


async def registered(backend: LocalBackend, name: str, tiny_model_path: Path) -> art.TrainableModel:
    model = art.TrainableModel(
        name=name, project="sft", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG, report_to=[]
    )
    await model.register(backend)
    return model


def history(backend: LocalBackend, name: str) -> list[dict[str, Any]]:
    lines = (backend.path / "sft" / "models" / name / "history.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


async def greedy(model: art.TrainableModel, question: str, max_tokens: int) -> tuple[str, str]:
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=[{"role": "user", "content": question}],
        temperature=0,
        max_tokens=max_tokens,
    )
    return completion.model, completion.choices[0].message.content or ""


async def rollout(model: art.TrainableModel, reward: float) -> art.Trajectory:
    """One sampled reply to "Say hi.", rewarded as given (a group of two with a spread trains)."""
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "Say hi."}], reward=reward)
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=6
    )
    trajectory.messages_and_choices.append(completion.choices[0])
    return trajectory


async def test_sft_memorises_a_reply_that_the_next_step_serves(backend: LocalBackend, tiny_model_path: Path) -> None:
    model = await registered(backend, "memo", tiny_model_path)
    demos = [demonstration(), demonstration("Name Zorbia's capital.")]
    losses = []
    for _ in range(3):
        result = await model.train_sft(demos, art.TrainSFTConfig(learning_rate=1e-2, batch_size=1), progress=False)
        losses.append(result.metrics["loss"])
    assert losses[0] > losses[1] > losses[2]  # the loss on the demonstrations falls call after call
    result = await model.train_sft(demos, art.TrainSFTConfig(learning_rate=1e-2, epochs=300), progress=False)
    assert result.step == 4 and result.metrics["optimizer_steps"] == 300 and result.metrics["turns_retokenized"] == 2
    assert result.metrics["loss_last"] < 0.05
    served, text = await greedy(model, "What is the capital of Zorbia?", 48)
    assert served == "memo@4" and text.endswith(REPLY)  # after the template's empty <think></think>
    rows = history(backend, "memo")
    assert [(row["step"], row["kind"]) for row in rows] == [(n, "sft") for n in (1, 2, 3, 4)]
    assert rows[0]["metrics"]["learning_rate"] == 1e-2 and rows[0]["metrics"]["tokens_trained"] > 0


async def test_the_server_trains_only_the_demonstrations_own_turns(
    backend: LocalBackend, tiny_model_path: Path
) -> None:
    model = await registered(backend, "examples", tiny_model_path)
    config = art.TrainSFTConfig(learning_rate=1e-4)
    alone, marked, unmarked = [
        (await model.train_sft([t], config, progress=False)).metrics["tokens_trained"]
        for t in (demonstration(), with_worked_example(0), with_worked_example(None))
    ]
    assert marked == alone < unmarked


async def test_sft_then_rl_then_sft_is_one_lineage(backend: LocalBackend, tiny_model_path: Path) -> None:
    model = await registered(backend, "mixed", tiny_model_path)
    assert (await model.train_sft([demonstration()], art.TrainSFTConfig(learning_rate=1e-3))).step == 1

    group = art.TrajectoryGroup([await rollout(model, 0.0), await rollout(model, 1.0)])
    assert (await model.train([group], progress=False)).step == 2
    best = group.trajectories[1]  # sampled by this server at step 1: SFT trains on its stored tokens
    result = await model.train_sft([best], art.TrainSFTConfig(learning_rate=1e-3, train_on="last_assistant"))
    assert result.step == 3 and result.metrics["turns_from_store"] == 1 and result.metrics["turns_retokenized"] == 0
    assert [(row["step"], row["kind"]) for row in history(backend, "mixed")] == [(1, "sft"), (2, "rl"), (3, "sft")]
    served, _ = await greedy(model, "Say hi.", 4)
    assert served == "mixed@3"


@pytest.mark.parametrize(
    ("trajectories", "config", "named"),
    [
        ([], {}, "trajectories is empty; pass at least one trajectory"),
        (
            [demonstration(), art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}])],
            {},
            r"trajectories\[1\] .*no assistant message",
        ),
        ([demonstration(reply="ab " * 5000)], {}, r"over the model's context of 4096 tokens.*truncate_to_context=True"),
        (
            [demonstration(question="ab " * 5000)],
            {"truncate_to_context": True},
            "no assistant token is left to train on: every reply was cut at the context",
        ),
        (
            [demonstration()] * 2,
            {"learning_rate": [1e-4] * 3, "batch_size": 1},
            "lists 3 rates but this call has 2 batches",
        ),
    ],
    ids=["empty", "no-assistant", "over-context", "truncated-to-nothing", "schedule-length"],
)
async def test_bad_input_is_a_400_and_the_last_checkpoint_keeps_serving(
    backend: LocalBackend, tiny_model_path: Path, trajectories: list[art.Trajectory], config: dict, named: str
) -> None:
    model = await registered(backend, "refused", tiny_model_path)
    with pytest.raises(ServerError, match=named) as refused:
        await model.train_sft(trajectories, art.TrainSFTConfig(**config), progress=False)
    assert refused.value.status == 400
    assert await model.get_step() == 0 and (await greedy(model, "hi", 2))[0] == "refused@0"
    assert not (backend.path / "sft" / "models" / "refused" / "history.jsonl").exists()


async def test_a_step_whose_weights_overflow_is_refused_naming_the_rate_and_step_n_serves(
    backend: LocalBackend, tiny_model_path: Path
) -> None:
    """A learning rate of 1e30 gives a finite loss (measured before the update) and weights whose logits overflow:
    committed, every completion would fail. SFT and RL alike are refused before the commit."""
    model = await registered(backend, "overflow", tiny_model_path)
    assert (await model.train_sft([demonstration()], art.TrainSFTConfig(learning_rate=1e-3), progress=False)).step == 1
    with pytest.raises(ArtError, match=r"learning_rate=1e\+30.*lower the learning rate.*step 1 keeps serving"):
        await model.train_sft([demonstration()], art.TrainSFTConfig(learning_rate=1e30), progress=False)
    assert await model.get_step() == 1 and (await greedy(model, "hi", 3))[0] == "overflow@1"
    group = art.TrajectoryGroup([await rollout(model, 0.0), await rollout(model, 1.0)])
    with pytest.raises(ArtError, match=r"learning_rate=1e\+30.*lower the learning rate.*step 1 keeps serving"):
        await model.train([group], art.TrainConfig(learning_rate=1e30), progress=False)
    assert [row["step"] for row in history(backend, "overflow")] == [1]
    assert not (backend.path / "sft" / "models" / "overflow" / "checkpoints" / "0002").exists()
    # the policy was put back too: the next sane call trains from step 1's weights, and serves
    assert (await model.train_sft([demonstration()], art.TrainSFTConfig(learning_rate=1e-3), progress=False)).step == 2
    assert (await greedy(model, "hi", 3))[0] == "overflow@2"


async def test_a_nan_loss_reaches_the_user_as_the_servers_sentence(
    backend: LocalBackend, tiny_model_path: Path
) -> None:
    model = await registered(backend, "nan-loss", tiny_model_path)
    config = art.TrainSFTConfig(learning_rate=1e30, epochs=3, batch_size=1)  # progress events carry a NaN loss
    with pytest.raises(ArtError, match="lower the learning rate") as failed:
        await model.train_sft([demonstration()], config, progress=False)
    assert "ValidationError" not in str(failed.value)
    assert await model.get_step() == 0 and (await greedy(model, "hi", 3))[0] == "nan-loss@0"


@pytest.mark.parametrize("event", [TrainEvent, TrainSFTEvent])
def test_non_finite_metrics_travel_as_null_and_come_back_as_nan(event: type[TrainEvent]) -> None:
    sent = event(type="progress", done=1, total=3, metrics={"loss": math.nan, "grad_norm": math.inf, "lr": 1e-3})
    line = sent.model_dump_json()
    json.loads(line)  # strict JSON: no NaN or Infinity literals
    received = event.model_validate_json(line)
    assert math.isnan(received.metrics["loss"]) and math.isnan(received.metrics["grad_norm"])
    assert received.metrics["lr"] == 1e-3


def test_lr_schedules_warm_up_then_decay() -> None:
    assert create_lr_schedule(5, 1.0, "linear", warmup_steps=2) == [0.5, 1.0, 1.0, 0.5, 0.0]
    assert create_lr_schedule(3, 1.0, "cosine") == pytest.approx([1.0, 0.5, 0.0])
    assert create_lr_schedule(3, 2.0, "constant", warmup_steps=1, min_lr=1.0) == [2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="unknown schedule method 'step'; use"):
        create_lr_schedule(3, 1.0, "step")  # type: ignore[arg-type]


def test_dataset_iterator_slices_one_schedule_over_chunks() -> None:
    demos = [demonstration(f"q{i}") for i in range(5)]
    chunks = list(create_sft_dataset_iterator(demos, chunk_size=2, epochs=2, batch_size=2, show_progress=False))
    assert [(len(c.trajectories), c.step, c.epoch, c.epoch_step) for c in chunks] == [
        (4, 0, 0, 0),
        (1, 2, 0, 2),
        (4, 3, 1, 0),
        (1, 5, 1, 2),
    ]
    rates = [rate for c in chunks for rate in c.config.learning_rate]  # type: ignore[union-attr]
    assert rates == create_lr_schedule(6, 2e-4, "linear", warmup_steps=0)
    for chunk in chunks:  # each chunk's schedule fits its call: one rate per batch
        assert chunk.config.learning_rates(len(chunk.config.batches(len(chunk.trajectories))))
    again = list(create_sft_dataset_iterator(demos, chunk_size=2, epochs=2, batch_size=2, show_progress=False))
    assert [t.id for c in again for t in c.trajectories] == [t.id for c in chunks for t in c.trajectories]
    resumed = list(create_sft_dataset_iterator(demos, 2, 2, 2, initial_step=2, show_progress=False))
    assert [c.step for c in resumed] == [2, 3, 5]  # resumes at the chunk holding batch 2


def write_conversations(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_iterate_file_reads_conversations_with_tools_and_names_bad_lines(tmp_path: Path) -> None:
    conversation = tool_conversation()
    line = json.dumps({"messages": conversation.messages(), "tools": conversation.tools})
    path = write_conversations(
        tmp_path / "demos.jsonl", [line, "", json.dumps({"messages": demonstration().messages()})]
    )
    read = list(iterate_file(path, epochs=2, seed=1))
    assert len(read) == 4 and sum(t.tools == [ADD_TOOL] for t in read) == 2
    assert all(t.messages()[2]["tool_calls"][0]["function"]["name"] == "add" for t in read if t.tools)
    assert len(list(iterate_file(path, epochs=2, initial_skip=3))) == 1
    bad = write_conversations(tmp_path / "bad.jsonl", [line, line, '{"messages": [{"role": "user"'])
    with pytest.raises(ValueError, match=r"bad.jsonl:3: not a conversation .*each line must be a JSON object"):
        list(iterate_file(bad))
    with pytest.raises(ValueError, match=r"empty.jsonl holds no conversations; write one"):
        list(iterate_file(write_conversations(tmp_path / "empty.jsonl", [""])))


async def test_train_sft_from_file_commits_one_step(
    backend: LocalBackend, tiny_model_path: Path, tmp_path: Path
) -> None:
    model = await registered(backend, "fromfile", tiny_model_path)
    conversation = tool_conversation()
    lines = [json.dumps({"messages": conversation.messages(), "tools": conversation.tools})] * 3
    await train_sft_from_file(model, write_conversations(tmp_path / "d.jsonl", lines), epochs=2, batch_size=2)
    row = history(backend, "fromfile")[-1]
    assert row["step"] == 1 and row["kind"] == "sft" and row["metrics"]["optimizer_steps"] == 3
    assert row["metrics"]["turns_retokenized"] == 12  # two assistant turns in each of 3 x 2 trajectories
    with pytest.raises(ValueError, match="holds no conversations"):
        await train_sft_from_file(model, write_conversations(tmp_path / "e.jsonl", []))
    assert await model.get_step() == 1


async def test_distilling_a_teachers_best_answers_teaches_the_student(
    backend: LocalBackend, tiny_model_path: Path
) -> None:
    asked: collections.Counter[str] = collections.Counter()

    def teacher_reply(body: dict[str, Any]) -> str:  # right every other time a question is asked, whatever the order
        question = body["messages"][-1]["content"]
        asked[question] += 1
        a, b = (int(x) for x in question[8:-1].split("+"))
        return f"The answer is {a + b}." if asked[question] % 2 == 0 else "Maybe 5."

    async def rollout(model: art.Model, a: int, b: int) -> art.Trajectory:
        trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": f"What is {a}+{b}?"}])
        completion = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=48, temperature=0
        )
        trajectory.messages_and_choices.append(completion.choices[0])
        trajectory.reward = float(str(a + b) in (completion.choices[0].message.content or ""))
        return trajectory

    student = await registered(backend, "student", tiny_model_path)
    with ScriptedOpenAI() as endpoint:
        endpoint.default = teacher_reply
        teacher = art.Model(name="teacher", inference_base_url=endpoint.base_url, inference_api_key="sk-test")
        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(teacher, a, b) for _ in range(2)) for a, b in [(3, 4), (2, 6)]),
            pbar_desc=None,
        )
    best = keep_best(groups, min_reward=1.0)
    assert sorted(t.messages()[-1]["content"] for t in best) == ["The answer is 7.", "The answer is 8."]
    result = await student.train_sft(best, art.TrainSFTConfig(learning_rate=1e-2, epochs=300), progress=False)
    assert result.metrics["turns_retokenized"] == 2 and result.metrics["turns_from_store"] == 0
    distilled = await rollout(student, 3, 4)
    assert distilled.messages()[-1]["content"].endswith("The answer is 7.") and distilled.reward == 1.0


def test_keep_best_keeps_rewarded_rollouts_best_first() -> None:
    def rewarded(reward: float, failed: bool = False) -> art.Trajectory:
        return art.Trajectory(messages_and_choices=[], reward=reward, failed=failed)

    groups = [art.TrajectoryGroup([rewarded(0.5), rewarded(0.9), rewarded(1.0, failed=True), rewarded(0.7)])]
    assert [t.reward for t in keep_best(groups, 0.6)] == [0.9, 0.7]
    assert [t.reward for t in keep_best(groups, 0.6, per_group=1)] == [0.9]


async def test_a_failed_sft_checkpoint_rolls_back_to_the_last_good_step(
    backend: LocalBackend, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_agents.server.storage import checkpoints

    model = await registered(backend, "rollback", tiny_model_path)

    async def logprobs() -> tuple[str, list[float]]:
        answer = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(), messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0
        )
        return answer.model, [t.logprob for t in answer.choices[0].logprobs.content]

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    before = await logprobs()
    config = art.TrainSFTConfig(learning_rate=1e-2, epochs=3)
    with monkeypatch.context() as patch:
        patch.setattr(checkpoints, "save_checkpoint", full_disk)
        with pytest.raises(art.ArtError, match=r"saving checkpoint 1 failed.*last good checkpoint 0 keeps serving"):
            await model.train_sft([demonstration()], config, progress=False)
    assert await model.get_step() == 0 and await logprobs() == before  # checkpoint 0's weights, not the trained ones
    assert not (backend.path / "sft" / "models" / "rollback" / "history.jsonl").exists()
    assert (await model.train_sft([demonstration()], config, progress=False)).step == 1
    served, trained = await logprobs()
    assert served == "rollback@1" and trained != before[1]


def test_each_batch_steps_on_its_own_gradients(tiny_model_path: Path, tokenizer: Any, store: TokenStore) -> None:
    """Two batches in one call update exactly as two calls of one batch each: no gradient carries over."""
    from test_training_trainer import lora_model

    from art_agents.server.training.trainer import PolicyTrainer

    demos = [demonstration(), demonstration("Name Zorbia's capital.", "Quuxtown, of course.")]
    config = art.TrainSFTConfig(learning_rate=1e-2, batch_size=1)
    weights = []
    for calls in ([demos], [demos[:1], demos[1:]]):
        model = lora_model(tiny_model_path)
        trainer = PolicyTrainer(model, tokenizer, store)
        for trajectories in calls:
            trainer.train_sft(trajectories, config, policy=Policy("m", 0))
        weights.append({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
    one_call, two_calls = weights
    assert max(float((one_call[n] - two_calls[n]).abs().max()) for n in one_call) < 1e-6
