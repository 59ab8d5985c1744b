"""The README.md of an export folder: how to serve it (the exact vLLM, SGLang, Ollama lines), and, as a Hugging
Face model card, what it is: the base model, the steps, the training history's last rows, the evaluations."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_agents.jsonl import read_history
from art_agents.report.tables import format_value

if TYPE_CHECKING:
    from art_agents.server.export.source import ExportInfo, Source

HISTORY_ROWS = 10
HISTORY_COLUMNS = ("reward_mean", "reward_std", "loss")
LIBRARY = {"lora": "peft", "merged": "transformers", "gguf": "gguf"}


def max_lora_rank(rank: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that holds `rank` (its choices; SGLang takes any)."""
    from art_agents.server.engines.vllm_engine import LORA_RANKS

    return next((r for r in LORA_RANKS if r >= rank), rank)


def vllm_command(source: Source, folder: Path, lora: bool) -> list[str]:
    """`vllm serve` for the export folder: the base model with the LoRA (named `name@step`), or the merged model."""
    serve = [
        "vllm",
        "serve",
        source.request.base_model if lora else str(folder),
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
    ]
    if lora:
        rank = max_lora_rank(source.request.config.lora_rank)
        return [*serve, "--enable-lora", f"--max-lora-rank={rank}", "--lora-modules", f"{source.served_as}={folder}"]
    return [*serve, "--served-model-name", source.served_as]


def sglang_command(source: Source, folder: Path, lora: bool) -> list[str]:
    if lora:
        return [
            "python", "-m", "sglang.launch_server", "--model-path", source.request.base_model, "--enable-lora",
            "--max-lora-rank", str(source.request.config.lora_rank), "--lora-paths", f"{source.served_as}={folder}",
        ]  # fmt: skip
    return [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(folder),
        "--served-model-name",
        source.served_as,
    ]


def model_card(source: Source, info: ExportInfo, folder: Path, gguf_overrides: dict[str, int] | None = None) -> str:
    """The README.md written into the export folder `folder` (its final path, named in the commands);
    `gguf_overrides`: what transformers needs told to load the GGUF file (`gguf.transformers_overrides`)."""
    request = source.request
    rows = [row for row in read_history(source.model_dir) if row.get("step", 0) <= source.step]
    trained = [row for row in rows if not row.get("split") and row.get("kind", "rl") in ("rl", "sft")]
    kinds = sorted({row.get("kind", "rl") for row in trained})
    base_note = f" (GGUF file `{request.config.gguf_file}`)" if request.config.gguf_file else ""
    lines = [
        "---",
        f"base_model: {request.base_model}",
        f"library_name: {LIBRARY[info.format]}",
        "tags: [art-agents, reinforcement-learning, lora]",
        "---",
        "",
        f"# {source.served_as}",
        "",
        f"`{request.name}` (project `{request.project}`) at step {source.step}, trained with "
        f"art-agents as a LoRA (rank {request.config.lora_rank}, alpha "
        f"{request.config.lora_alpha}) on `{request.base_model}`{base_note}: {len(trained)} training "
        f"step{'' if len(trained) == 1 else 's'}"
        f"{' (' + ', '.join(kinds) + ')' if kinds else ''}. Exported as `{info.format}`"
        f"{f' ({info.quantization})' if info.quantization else ''}.",
        "",
        "## Serve it",
        "",
        *_serving(source, info, folder, gguf_overrides or {}),
        *_history_table(trained[-HISTORY_ROWS:]),
        *_evaluation_tables(source.model_dir, [row for row in rows if row.get("split")]),
    ]
    return "\n".join(lines) + "\n"


def _serving(source: Source, info: ExportInfo, folder: Path, gguf_overrides: dict[str, int]) -> list[str]:
    name = source.served_as
    if info.format == "gguf":
        gguf_file = folder / source.gguf_name
        return [
            *_gguf_serving(source, folder, gguf_file),
            *_gguf_transformers(folder, gguf_file.name, gguf_overrides),
        ]
    lora = info.format == "lora"
    gguf_base = source.request.config.gguf_file
    lines = [
        f"With vLLM, answering `model={name!r}` on its OpenAI-compatible API:",
        "",
        "```",
        shlex.join(vllm_command(source, folder, lora)),
        "```",
        "",
        "With SGLang:",
        "",
        "```",
        shlex.join(sglang_command(source, folder, lora)),
        "```",
        "",
    ]
    if lora and gguf_base:
        lines += [
            f"The base model was loaded from a GGUF file; vLLM and SGLang need its transformers checkpoint (its hub "
            f"id) in place of `{source.request.base_model}`, or export `--format merged`.",
            "",
        ]
    load = (
        f"from peft import AutoPeftModelForCausalLM\nmodel = AutoPeftModelForCausalLM.from_pretrained({str(folder)!r})"
        if lora
        else f"from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained({str(folder)!r})"
    )
    return [
        *lines,
        "With transformers (the tokenizer and chat template are in this folder):",
        "",
        "```python",
        load,
        "from transformers import AutoTokenizer",
        f"tokenizer = AutoTokenizer.from_pretrained({str(folder)!r})",
        "```",
        "",
    ]


def _gguf_serving(source: Source, folder: Path, gguf_file: Path) -> list[str]:
    return [
        "With Ollama (the Modelfile's TEMPLATE renders chat as the model's chat template does):",
        "",
        "```",
        f"cd {shlex.quote(str(folder))}",
        f"ollama create {source.request.name} -f Modelfile",
        f"ollama run {source.request.name}",
        "```",
        "",
        "With llama.cpp (the chat template is in the file's metadata):",
        "",
        "```",
        f"llama-server -m {shlex.quote(str(gguf_file))} --jinja",
        "```",
        "",
    ]


def _gguf_transformers(folder: Path, gguf_name: str, overrides: dict[str, int]) -> list[str]:
    """transformers' lines for the GGUF file (it dequantizes it to float weights), with the keywords its reader
    needs for what it does not take from the file."""
    keywords = "".join(f", {key}={value!r}" for key, value in overrides.items())
    why = [
        f"The keywords after `gguf_file` give what transformers' GGUF reader does not take from the file's metadata "
        f"({', '.join(overrides)}; llama.cpp reads it from there).",
        "",
    ]
    return [
        "With transformers (the tokenizer and chat template are in the file):",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f"model = AutoModelForCausalLM.from_pretrained({str(folder)!r}, gguf_file={gguf_name!r}{keywords})",
        f"tokenizer = AutoTokenizer.from_pretrained({str(folder)!r}, gguf_file={gguf_name!r})",
        "```",
        "",
        *(why if overrides else []),
    ]


def _history_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = [
        f"## Training history (last {len(rows)} steps)",
        "",
        "| step | kind | " + " | ".join(HISTORY_COLUMNS) + " |",
        "|---:|---|" + "---:|" * len(HISTORY_COLUMNS),
    ]
    for row in rows:
        metrics = row.get("metrics") or {}
        values = " | ".join(format_value(metrics.get(name, row.get(name))) for name in HISTORY_COLUMNS)
        lines.append(f"| {row.get('step')} | {row.get('kind', 'rl')} | {values} |")
    return [*lines, ""]


def _evaluation_tables(model_dir: Path, rows: list[dict[str, Any]]) -> list[str]:
    """The model's evaluations: `art.evaluate`'s summaries (mean reward with its 95% CI per model) and the
    evaluations logged with `model.log` (history rows with a split)."""
    from art_agents.evaluation.files import read_summaries

    summaries = read_summaries(model_dir)
    if not summaries and not rows:
        return []
    lines = ["## Evaluation", ""]
    if summaries:
        lines += ["| evaluation | model | step | mean reward | 95% CI | scenarios |", "|---|---|---:|---:|---|---:|"]
        for summary in summaries:
            for entry in summary.models:
                interval = f"{format_value(entry.ci_low)} to {format_value(entry.ci_high)}"
                lines.append(
                    f"| {summary.name} | {entry.model} | {format_value(entry.step)} | "
                    f"{format_value(entry.mean_reward)} | {interval} | {entry.scenarios} |"
                )
        lines.append("")
    if rows:
        lines += ["| split | step | reward | reward_std | n |", "|---|---:|---:|---:|---:|"]
        for row in rows:
            split, metrics = row["split"], row.get("metrics") or {}
            values = " | ".join(format_value(metrics.get(f"{split}/{name}")) for name in ("reward", "reward_std", "n"))
            lines.append(f"| {split} | {row.get('step')} | {values} |")
        lines.append("")
    return lines
