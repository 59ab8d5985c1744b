"""`art-agents export`: a trained step out to vLLM/SGLang (lora), any transformers server (merged) or
llama.cpp/Ollama (gguf), and optionally to the Hugging Face Hub."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from art_agents.extras import require_extra


def export(
    run_dir: Annotated[
        Path,
        typer.Argument(
            metavar="RUN_OR_MODEL_DIR",
            help="A model folder (<art_path>/<project>/models/<name>), or a project, server or run folder with one "
            "model (else pick it with --model).",
            show_default=False,
        ),
    ],
    to: Annotated[Path, typer.Option(help="Folder to write (must not exist unless --overwrite).", show_default=False)],
    format: Annotated[
        str, typer.Option(help="lora (adapter for vLLM/SGLang), merged (transformers folder) or gguf (+ Modelfile).")
    ] = "lora",
    step: Annotated[int | None, typer.Option(help="Checkpoint step to export. Default: the latest.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name, when RUN_OR_MODEL_DIR holds several.")] = None,
    quantization: Annotated[
        str | None, typer.Option(help="GGUF tensor type: f32, f16, bf16 or q8_0. Default: the base model's dtype.")
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace --to if it exists.")] = False,
    push_to_hub: Annotated[
        str | None, typer.Option(help="Also upload the folder to this Hugging Face repo (token: HF_TOKEN).")
    ] = None,
    public: Annotated[
        bool, typer.Option("--public", help="Make a new --push-to-hub repo public (default: private).")
    ] = False,
) -> None:
    """Export a trained checkpoint to a folder a model server loads (written whole or not at all)."""
    require_extra("server", purpose="art-agents export", load=False)
    from art_agents.server.export.source import ExportError
    from art_agents.server.export.writer import export_model

    try:
        folder = export_model(
            run_dir,
            to,
            format=format,
            step=step,
            model=model,
            overwrite=overwrite,
            quantization=quantization,  # type: ignore[arg-type]
        )
        typer.echo(f"exported to {folder} (see its README.md for how to serve it)")
        if push_to_hub:
            from art_agents.server.export.hub import push_to_hub as push

            typer.echo(f"pushed to {push(folder, push_to_hub, private=not public)}")
    except ExportError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
