"""Which reporters a model gets, and that a failing one costs a warning, never the step."""

from __future__ import annotations

import sys

import pytest

import art_agents as art
from art_agents.errors import ArtError
from art_agents.report import reporters
from art_agents.report.reporters import StepRecord


def test_report_to_is_read_from_the_model_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (reporters.REPORT_TO_ENV, *(key for keys in reporters.CONFIGURED_BY.values() for key in keys)):
        monkeypatch.delenv(key, raising=False)
    assert reporters.reporter_names(None) == []  # off unless asked for or configured
    monkeypatch.setenv(reporters.REPORT_TO_ENV, " WandB, ")
    assert reporters.reporter_names(None) == ["wandb"]
    for key in reporters.LANGFUSE_KEYS:
        monkeypatch.setenv(key, "pk-or-sk")
    assert reporters.reporter_names(None) == ["wandb", "langfuse"]  # Langfuse's own variables turn it on
    monkeypatch.setenv(reporters.OPENPIPE_KEY, "opk")
    assert reporters.reporter_names(None) == ["wandb", "langfuse", "openpipe"]
    assert reporters.reporter_names([]) == []  # an explicit list wins over the environment
    assert reporters.reporter_names(["langfuse", "langfuse"]) == ["langfuse"]
    monkeypatch.setenv(reporters.REPORT_TO_ENV, "none")
    assert reporters.reporter_names(None) == []
    with pytest.raises(ArtError, match=r"unknown reporter tensorboard.*wandb, langfuse, openpipe or none"):
        reporters.reporter_names(["tensorboard"])


@pytest.mark.parametrize("name", sorted(set(reporters.REPORTERS) - {"openpipe"}))  # OpenPipe needs httpx only
def test_a_missing_library_names_its_extra(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, name, None)  # the library is not installed: importing it fails
    monkeypatch.delitem(sys.modules, reporters.REPORTERS[name].split(":")[0], raising=False)
    model = art.TrainableModel(name="m", base_model="base")
    with pytest.raises(ArtError, match=rf"needs the {name} extra.*pip install 'art-agents\[{name}\]'"):
        reporters.create_reporters([name], model)


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.records: list[StepRecord] = []

    def record(self, record: StepRecord) -> None:
        if self.fail:
            raise ConnectionError("host down")
        self.records.append(record)

    def close(self) -> None:
        if self.fail:
            raise ConnectionError("host down")


def test_a_failing_reporter_warns_and_the_others_still_record() -> None:
    broken, working = Recorder(fail=True), Recorder()
    record = StepRecord("train", 3, [], {"loss": 0.5}, 1.0, 2.0)
    with pytest.warns(RuntimeWarning, match=r"could not record step 3 \(ConnectionError: host down\).*history.jsonl"):
        reporters.send([broken, working], record)
    assert working.records == [record]
    with pytest.warns(RuntimeWarning, match="could not flush"):
        reporters.close([broken, working])
