"""`TrainSFTConfig` refuses the learning rates `TrainConfig` refuses, in the same words, and docs/sft.md says what
to pick and what a refused call raises."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from art_agents import TrainConfig, TrainSFTConfig
from art_agents.errors import ServerError

SFT_DOCS = Path(__file__).resolve().parent.parent / "docs" / "sft.md"


def problems(**settings: object) -> list[tuple[tuple[int | str, ...], str]]:
    with pytest.raises(ValidationError) as refused:
        TrainSFTConfig(**settings)
    return [(error["loc"], error["msg"]) for error in refused.value.errors()]


def test_nan_inf_and_negative_rates_are_refused_by_field_in_pydantics_words() -> None:
    assert problems(learning_rate=math.nan) == [(("learning_rate", "rate"), "Input should be a finite number")]
    assert problems(learning_rate=math.inf) == [(("learning_rate", "rate"), "Input should be a finite number")]
    assert problems(learning_rate=-1e-4) == [(("learning_rate", "rate"), "Input should be greater than or equal to 0")]
    assert problems(learning_rate=[1e-4, math.nan]) == [
        (("learning_rate", "schedule", 1), "Input should be a finite number")
    ]
    assert problems(learning_rate=[]) == [
        (("learning_rate", "schedule"), "List should have at least 1 item after validation, not 0")
    ]
    with pytest.raises(ValidationError, match=r"learning_rate\n  Input should be greater than 0"):
        TrainConfig(learning_rate=-1e-4)  # the same kind of sentence
    assert TrainSFTConfig(learning_rate=[1e-4, 0.0]).learning_rates(2) == [1e-4, 0.0]  # a decayed schedule's end
    assert TrainSFTConfig(learning_rate=0.0).learning_rates(1) == [0.0]


def test_a_bad_sft_rate_in_a_run_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text("[sft]\nlearning_rate = nan\n")
    argv = ["mcp-rl", "--server", "python x", "--base-model", "x", "--judge-model", "openai/j"]
    result = subprocess.run(
        [sys.executable, "-m", "art_agents", *argv, "--judge-api-key", "k", "--out", "out", "--config", "run.toml"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: sft.learning_rate.rate in run.toml: Input should be a finite number (got nan)"
    ]
    assert not (tmp_path / "out").exists()


def test_the_sft_page_gives_rate_guidance_and_names_the_refusal() -> None:
    page = SFT_DOCS.read_text(encoding="utf-8")
    default = TrainSFTConfig().learning_rate
    assert f"The default, {default:.0e}".replace("e-05", "e-5") in page and "1e-3" in page and "1e-4" in page
    assert "`art_agents.errors.ServerError`" in page
    assert str(ServerError(400, "...")) in page  # the message as the exception writes it
    one_line = "error: sft.learning_rate.rate in run.toml: Input should be a finite number (got nan)"
    assert one_line in page.replace("\n", " ")  # what the run-file test above prints
