"""Every notebook runs as written (on the tiny model), so the examples cannot rot.

The notebooks are stored with the outputs of such a run, so they read well on GitHub. To refresh
them, run `ART_AGENTS_STORE_NOTEBOOKS=1 python -m pytest -m slow tests/test_notebooks.py`: each
notebook that passes is written back over its source.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    # transformers' bar for writing the tiny model would be stored as a widget: blank or stuck at 0% on GitHub
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
        record_timing=False,  # timestamps in the cell metadata would make every stored run a diff
        coalesce_streams=True,  # one stdout and one stderr block per cell, progress bars at their final state
    ).execute()
    outputs = [o for cell in notebook.cells for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    stderr = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr")
    assert "Traceback" not in stderr
    # tqdm.auto (transformers imports it) warns in a notebook without ipywidgets: the `notebooks` extra
    assert not [o for o in outputs if "TqdmWarning" in json.dumps(o)]
    if os.environ.get("ART_AGENTS_STORE_NOTEBOOKS") == "1":
        nbformat.write(notebook, path)


def test_getting_started_lists_every_notebook_and_how_to_open_them() -> None:
    section = (NOTEBOOKS[0].parent.parent / "docs" / "getting-started.md").read_text().split("## Notebooks", 1)[1]
    assert [path.name for path in NOTEBOOKS if f"`{path.name}`" not in section] == []
    assert "pip install -c constraints.txt -e '.[notebooks]' && jupyter lab notebooks/" in section
