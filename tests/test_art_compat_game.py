"""A multi-turn game program shaped like OpenPipe ART's 2048 example, with only `art` renamed to `art_agents`.

ART's best-known example plays a board game turn by turn: the rollout appends each returned `Choice` to
`messages_and_choices`, answers with the new board as a user message, and ends the game on an invalid move; the
model's `_internal_config` is set after construction; the loop gathers, deletes old checkpoints and trains. This
runs that shape (its utils, rollout and train parts, in our own words and with a tiny game of our own) on the tiny
model through a real `LocalBackend`, and checks that every turn of every multi-turn game trains on the tokens the
server sampled, that a rollout retried by `@art.retry` leaves no stray turns behind, and that steps advance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

import httpx
import openai
from pydantic import BaseModel

import art_agents as art
from art_agents.local import LocalBackend
from art_agents.utils import iterate_dataset

# --- utils: a tiny deterministic grid walk ---------------------------------------------------------------------

BOARD_SIZE = 3
MAX_MOVES = 3
GOALS = [(0, 0), (0, 2), (2, 0), (2, 2)]  # one corner per game id; the walker starts in the middle
DIRECTIONS = {"l": (0, -1), "r": (0, 1), "u": (-1, 0), "d": (1, 0)}


class GridGame(TypedDict):
    id: int
    row: int
    col: int
    goal: tuple[int, int]
    moves: int


def generate_game(game_id: int) -> GridGame:
    return {"id": game_id, "row": 1, "col": 1, "goal": GOALS[game_id % len(GOALS)], "moves": 0}


def render_board(game: GridGame) -> str:
    """One line per row: `A` is the walker, `G` the goal, `.` an empty cell."""
    cells = [["."] * BOARD_SIZE for _ in range(BOARD_SIZE)]
    cells[game["goal"][0]][game["goal"][1]] = "G"
    cells[game["row"]][game["col"]] = "A"
    return "\n".join("".join(row) for row in cells)


def apply_agent_move(game: GridGame, reply: str) -> None:
    """The first of the letters l, r, u, d in the reply names the move ("left", "<move>up</move>" and a random
    model's babble alike); a reply without one, or a move off the board, is invalid."""
    letter = next((c for c in reply.lower() if c in DIRECTIONS), None)
    if letter is None:
        raise ValueError(f"no move in {reply!r}")
    row, col = game["row"] + DIRECTIONS[letter][0], game["col"] + DIRECTIONS[letter][1]
    if not (0 <= row < BOARD_SIZE and 0 <= col < BOARD_SIZE):
        raise ValueError(f"{reply!r} walks off the board")
    game["row"], game["col"], game["moves"] = row, col, game["moves"] + 1


def reached_goal(game: GridGame) -> bool:
    return (game["row"], game["col"]) == game["goal"]


def check_game_finished(game: GridGame) -> bool:
    return reached_goal(game) or game["moves"] >= MAX_MOVES


def letter_share(replies: list[str]) -> float:
    """How much of what the model wrote were ASCII letters (words, not noise): a tie-breaker, so that a group of
    games the random model loses in the same number of moves still has a spread of rewards."""
    text = "".join(replies)
    return sum(c.isascii() and c.isalpha() for c in text) / len(text) if text else 0.0


class GameHost:
    """Stands in for a remote game host (ART's example talks to services over HTTP): the first move sent for each
    game id in `flaky` times out once, as a busy host does."""

    def __init__(self, flaky: set[int]) -> None:
        self.flaky = set(flaky)
        self.games_started = 0

    def start(self, game_id: int) -> GridGame:
        self.games_started += 1
        return generate_game(game_id)

    def move(self, game: GridGame, reply: str) -> None:
        if game["id"] in self.flaky:
            self.flaky.discard(game["id"])
            raise httpx.ReadTimeout("the game host did not answer")
        apply_agent_move(game, reply)


HOST = GameHost(flaky=set())

# --- rollout ---------------------------------------------------------------------------------------------------

SYSTEM_PROMPT = (
    "You walk on a 3x3 board toward the goal G; A is you. Reply with one move: left, right, up or down. "
    f"Walking off the board loses; you have {MAX_MOVES} moves."
)


class GameScenario(BaseModel):
    step: int
    game_id: int


@art.retry(exceptions=(openai.LengthFinishReasonError, httpx.ReadTimeout))
async def rollout(model: art.Model, scenario: GameScenario) -> art.Trajectory:
    client = model.openai_client()
    game = HOST.start(scenario.game_id)
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": render_board(game)},
        ],
        metadata={"game_id": game["id"], "step": scenario.step},
        reward=0,
    )
    replies: list[str] = []
    while True:
        chat_completion = await client.chat.completions.create(
            max_completion_tokens=6, messages=trajectory.messages(), model=model.name
        )
        choice = chat_completion.choices[0]
        content = choice.message.content
        assert isinstance(content, str)
        trajectory.messages_and_choices.append(choice)
        replies.append(content)
        try:
            HOST.move(game, content)
        except ValueError:
            trajectory.metrics["invalid_move"] = 1
            break
        if check_game_finished(game):
            break
        trajectory.messages_and_choices.append({"role": "user", "content": render_board(game)})
    trajectory.metrics["moves"] = game["moves"]
    trajectory.metrics["won"] = int(reached_goal(game))
    # ART's example gives -1 for an invalid move, but nearly every game of a random model ends on one: partial credit
    # for every move made, a bonus for the goal, and the letter share to break ties keep the rewards of a group apart.
    trajectory.reward = game["moves"] / MAX_MOVES + reached_goal(game) + 0.1 * letter_share(replies)
    return trajectory


# --- checks ----------------------------------------------------------------------------------------------------


def model_turns(groups: list[art.TrajectoryGroup]) -> int:
    return sum(m["role"] == "assistant" for g in groups for t in g.trajectories for m in t.messages())


def replay(trajectory: art.Trajectory) -> None:
    """The trajectory's messages are the game as played: replaying its replies renders each board it was shown."""
    messages = trajectory.messages()
    assert [m["role"] for m in messages[:2]] == ["system", "user"] and messages[-1]["role"] == "assistant"
    game = generate_game(trajectory.metadata["game_id"])
    assert messages[1]["content"] == render_board(game)
    replies, boards = messages[2::2], messages[3::2]
    assert {m["role"] for m in replies} == {"assistant"} and {m["role"] for m in boards} <= {"user"}
    for reply, board in zip(replies[:-1], boards, strict=True):  # a board after each reply but the last
        apply_agent_move(game, reply["content"])
        assert board["content"] == render_board(game)
    try:  # the last reply ended the game: an invalid move, or the goal or the last move reached
        apply_agent_move(game, replies[-1]["content"])
    except ValueError:
        assert trajectory.metrics.get("invalid_move") == 1
    else:
        assert check_game_finished(game) and "invalid_move" not in trajectory.metrics
    assert trajectory.metrics["moves"] == game["moves"]


async def test_a_multi_turn_game_program_trains_on_the_tokens_it_played(tmp_path: Path, tiny_model_path: Path) -> None:
    HOST.flaky, HOST.games_started = {1}, 0  # game 1's first move times out once: that rollout starts over

    # --- train: as ART's example declares, configures and registers its model ---
    model = art.TrainableModel(name="walker-001", project="grid-walk", base_model=str(tiny_model_path))
    default_memory = model.server_config.gpu_memory_utilization
    model._internal_config = art.dev.InternalModelConfig(
        init_args=art.dev.InitArgs(max_seq_length=2048),
        engine_args=art.dev.EngineArgs(gpu_memory_utilization=0.55, enforce_eager=True),
    )
    backend = LocalBackend(in_process=True, path=str(tmp_path / ".art"))
    await model.register(backend)
    assert default_memory != 0.55 and model.server_config.gpu_memory_utilization == 0.55
    stored = json.loads((tmp_path / ".art" / "grid-walk" / "models" / "walker-001" / "model.json").read_text())
    assert stored["config"]["gpu_memory_utilization"] == 0.55  # the server got it too

    try:
        steps: list[tuple[int, art.TrainResult, list[art.TrajectoryGroup]]] = []
        deleted: list[list[int]] = []
        for batch in iterate_dataset(
            list(range(len(GOALS))), groups_per_step=2, num_epochs=1, initial_step=await model.get_step()
        ):
            train_groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(
                        rollout(model, GameScenario(step=batch.step, game_id=game_id)) for _ in range(4)
                    )
                    for game_id in batch.items
                ),
                pbar_desc="gather",
                max_exceptions=0,
            )
            deleted.append(await model.delete_checkpoints())
            result = await model.train(train_groups, config=art.TrainConfig(learning_rate=1e-5))
            steps.append((batch.step, result, train_groups))

        assert [(step, result.step) for step, result, _ in steps] == [(0, 1), (1, 2)]
        assert deleted == [[], []]  # the latest step and step 0 stay
        assert HOST.flaky == set() and HOST.games_started == 2 * 2 * 4 + 1  # one game was started over
        for step, result, groups in steps:
            assert all(len(set(g.rewards())) > 1 for g in groups)
            turns = model_turns(groups)
            assert turns > 2 * 4  # more turns than games: some games went on after a move
            # Every turn's tokens came from the store, sampled by the step being trained; the retried game's
            # abandoned first turn is not among them.
            assert result.metrics["turns_retokenized"] == 0
            assert result.metrics["turns_from_store"] == turns
            assert result.metrics["turns_staleness_0"] == turns
            for group in groups:
                for trajectory in group.trajectories:
                    assert trajectory.metadata["step"] == step
                    replay(trajectory)

        assert await model.delete_checkpoints() == [1]
        reply = await model.openai_client().chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": render_board(generate_game(0))}], max_tokens=2
        )
        assert reply.model == "walker-001@2"
    finally:
        await backend.close()
