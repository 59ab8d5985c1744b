"""A committed checkpoint out to where models are served: a LoRA folder, a merged transformers folder, or GGUF.

Every format is written into a temp folder beside the target and renamed into place at the end, so a failed
export (a full disk, Ctrl-C) leaves nothing half-written; an existing target is replaced only when asked.
The weights are the checkpoint the server served as `name@step`: the LoRA folder holds its adapter files as
saved, the merged folder is the base with that adapter merged in (PEFT's `merge_and_unload`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from art_agents.atomic import new_file_mode
from art_agents.server.export.source import FORMATS, ExportError, ExportInfo, Format, Source, open_source

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
EXPORT_INFO = "export.json"


def export_model(
    folder: str | Path,
    to: str | Path,
    *,
    format: Format = "lora",
    step: int | None = None,
    model: str | None = None,
    overwrite: bool = False,
    quantization: str | None = None,
) -> Path:
    """Write step `step` (default: the latest) of the model in `folder` to the folder `to` in `format`.

    `quantization` is GGUF's tensor type (f32, f16, bf16, q8_0; default: the base model's dtype). Returns `to`.
    """
    if format not in FORMATS:
        raise ExportError(f"--format {format!r} is not one of {', '.join(FORMATS)}")
    if quantization is not None and format != "gguf":
        raise ExportError(f"--quantization is for --format gguf; a {format} export keeps the base model's dtype")
    source = open_source(folder, step, model)
    target = Path(to).expanduser().resolve()
    if target.exists() and not overwrite:
        raise ExportError(f"{target} already exists; pass --overwrite to replace it, or pick another --to")
    if target == source.model_dir or source.model_dir.is_relative_to(target):
        raise ExportError(f"--to {target} would replace the model folder it exports from; pick another folder")
    writers: dict[str, Callable[[Source, Path], str | None]] = {
        "lora": write_lora,
        "merged": write_merged,
        "gguf": lambda src, tmp: write_gguf_folder(src, tmp, quantization),
    }

    def write(tmp: Path) -> None:
        from art_agents.server.host.quiet import quiet_transformers

        with quiet_transformers():
            written_quantization = writers[format](source, tmp)
        info = ExportInfo(
            name=source.request.name,
            project=source.request.project,
            step=source.step,
            base_model=source.request.base_model,
            gguf_file=source.request.config.gguf_file,
            format=format,
            quantization=written_quantization,
            exported_at=time.time(),
        )
        (tmp / EXPORT_INFO).write_text(info.model_dump_json(indent=2) + "\n", encoding="utf-8")
        from art_agents.server.export.gguf import transformers_overrides
        from art_agents.server.export.model_card import model_card

        overrides = transformers_overrides(tmp / source.gguf_name) if format == "gguf" else {}
        (tmp / "README.md").write_text(model_card(source, info, target, overrides), encoding="utf-8")

    return write_folder_atomic(target, write)


def write_folder_atomic(target: Path, write: Callable[[Path], Any]) -> Path:
    """`write` fills a temp folder beside `target`, which then replaces `target`; on any failure the temp
    folder is removed and an existing `target` is left as it was. A failed write (a full disk) is one line."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        write(tmp)
        _plain_modes(tmp)
        if target.exists():
            os.rename(target, old)
        os.rename(tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not target.exists():
            os.rename(old, target)
        reason = _io_error(exc)
        if reason is None:
            raise
        raise ExportError(
            f"writing {target} failed ({reason}); nothing was left behind: free space in {target.parent} or pick "
            "another --to, then rerun"
        ) from exc
    shutil.rmtree(old, ignore_errors=True)
    return target


def _plain_modes(folder: Path) -> None:
    """Every file at the mode a plain write gives it (the umask's): safetensors writes its file as 0o600."""
    mode = new_file_mode()
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(mode)


def _io_error(exc: BaseException) -> str | None:
    """What an I/O failure says (an OSError's, or safetensors' own error wrapping one); None for other errors."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    found = re.search(r"I/O error: (.+?)\s*\(os error\s*\d+\)", str(exc))
    return found.group(1) if found else None


def write_lora(source: Source, folder: Path) -> None:
    """The checkpoint's adapter, naming the base model, with the tokenizer and chat template a server needs."""
    for name in ADAPTER_FILES:
        shutil.copyfile(source.checkpoint / name, folder / name)
    config_path = folder / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text(encoding="utf-8"))
    adapter_config["base_model_name_or_path"] = source.request.base_model
    config_path.write_text(json.dumps(adapter_config, indent=2) + "\n", encoding="utf-8")
    base_tokenizer(source).save_pretrained(folder)


def write_merged(source: Source, folder: Path) -> None:
    """The base model with the step's LoRA merged in: a transformers folder any server loads."""
    from art_agents.server.models.lora_model import load_generation_config

    model = merged_model(source)
    model.generation_config = load_generation_config(source.request.base_model, source.request.config)
    model.save_pretrained(folder)
    base_tokenizer(source).save_pretrained(folder)


def write_gguf_folder(source: Source, folder: Path, quantization: str | None) -> str:
    """The merged model as one GGUF file with an Ollama Modelfile beside it; returns the tensor type written."""
    from art_agents.server.export.gguf import write_gguf
    from art_agents.server.export.ollama_modelfile import modelfile

    model = merged_model(source)
    tokenizer = base_tokenizer(source)
    file = folder / source.gguf_name
    written = write_gguf(
        model, tokenizer, file, name=source.served_as, quantization=quantization, base=source_gguf(source)
    )
    (folder / "Modelfile").write_text(modelfile(file.name, tokenizer), encoding="utf-8")
    return written


def merged_model(source: Source) -> Any:
    """The base model in its own dtype with the step's adapter merged into its weights."""
    from peft import PeftModel

    from art_agents.server.models.lora_model import load_base_model

    config = source.request.config
    base = load_base_model(source.request.base_model, config, "auto" if config.dtype == "auto" else config.dtype)
    _drop_gguf_quantizer(base)
    if base.config.tie_word_embeddings and {"lm_head", "embed_tokens"} & set(config.target_modules):
        _untie(base)
    return PeftModel.from_pretrained(base, str(source.checkpoint)).merge_and_unload().eval()


def _drop_gguf_quantizer(model: Any) -> None:
    """A base loaded from a GGUF file keeps transformers' GGUF quantizer, which `save_pretrained` refuses; once
    dequantized (always on CPU) its weights are plain float tensors and the quantizer is only a label."""
    if getattr(model, "hf_quantizer", None) is None:
        return
    if not all(parameter.dtype.is_floating_point for parameter in model.parameters()):
        raise ExportError(
            "the base model's GGUF weights were loaded still quantized (a GGUF kernel on this GPU), so the LoRA "
            "cannot be merged into them; rerun the export with CUDA_VISIBLE_DEVICES= to load them dequantized"
        )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _untie(model: Any) -> None:
    """Give the output head its own copy of the tied embedding: a LoRA on one of the two changes only that one
    when served, so merging it into the shared tensor would change both."""
    import torch

    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    model.config.tie_word_embeddings = False


def base_tokenizer(source: Source) -> Any:
    from art_agents.server.models.lora_model import load_tokenizer

    return load_tokenizer(source.request.base_model, source.request.config)


def source_gguf(source: Source) -> Path | None:
    """The base model's own GGUF file, when it was loaded from one (its tokenizer metadata is carried over)."""
    gguf_file = source.request.config.gguf_file
    return Path(source.request.base_model) / gguf_file if gguf_file else None
