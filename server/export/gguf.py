"""A merged transformers model written as GGUF (llama.cpp, Ollama) with the `gguf` package's writer.

llama.cpp's own converter (`convert_hf_to_gguf.py`) is not in the `gguf` wheel, so this does its part for
the families it names, as that converter does: tensors renamed by `gguf`'s own name map, Llama's q/k rows
permuted for llama.cpp's rotary layout (Qwen3 keeps the Hugging Face layout), a tied output head left out
(llama.cpp reuses the embedding), 1-D tensors kept in f32, and the tokenizer's BPE vocabulary, merges,
special ids and chat template as metadata. A family or tokenizer it does not convert is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from art_agents.server.export.source import ExportError

QUANTIZATIONS = ("f32", "f16", "bf16", "q8_0")
DTYPE_QUANTIZATION = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
# transformers model_type -> gguf MODEL_ARCH member name
FAMILIES = {"llama": "LLAMA", "qwen3": "QWEN3"}
# pre-tokenizer split patterns of tokenizer.json -> llama.cpp's name for them (tokenizer.ggml.pre)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
PRE_TOKENIZERS = {QWEN2_SPLIT: "qwen2", LLAMA3_SPLIT: "llama-bpe"}
# the shapes a GGUF file states (`<arch>.` + key) -> the transformers config attribute each one is
SHAPES = {
    "attention.key_length": "head_dim",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "vocab_size": "vocab_size",
}


def default_quantization(model: Any) -> str:
    """The tensor type that keeps the model's own dtype."""
    return DTYPE_QUANTIZATION.get(str(model.dtype).removeprefix("torch."), "f32")


def write_gguf(
    model: Any, tokenizer: Any, path: Path, *, name: str, quantization: str | None, base: Path | None
) -> str:
    """Write `model` (a merged transformers causal LM) and its tokenizer to the GGUF file `path` (`name`: its
    general.name).

    `base` is the GGUF file the base model was loaded from, if any: its tokenizer metadata is copied as it is.
    Returns the tensor type of the 2-D weights (f32, f16, bf16 or q8_0).
    """
    import gguf

    config = model.config
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise ExportError(
            f"GGUF export converts the {' and '.join(FAMILIES)} families, not {config.model_type!r}; export "
            "--format merged and convert that folder with llama.cpp's convert_hf_to_gguf.py"
        )
    quantization = quantization or default_quantization(model)
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"--quantization {quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    _check_rope(config)
    arch = gguf.MODEL_ARCH[family]
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(name)
    _add_hyperparameters(writer, config, family, quantization)
    if base is not None:
        _copy_tokenizer(writer, base)
    else:
        _add_tokenizer(writer, tokenizer, config.vocab_size)
    _add_tensors(writer, model, arch, family, quantization)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return quantization


def transformers_overrides(path: Path) -> dict[str, int]:
    """The shapes the GGUF file states that transformers' GGUF reader does not take from it, as `from_pretrained`
    keywords: its qwen3 mapping ignores `attention.key_length`, so a head size other than Qwen3Config's default
    (128, every Qwen3 checkpoint's) loads only with `head_dim=` given."""
    import gguf
    from transformers import AutoConfig

    fields = gguf.GGUFReader(path).fields
    arch = fields["general.architecture"].contents()
    stated = {attr: fields[f"{arch}.{key}"].contents() for key, attr in SHAPES.items() if f"{arch}.{key}" in fields}
    read = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    return {attr: value for attr, value in stated.items() if getattr(read, attr, None) != value}


def _check_rope(config: Any) -> None:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ExportError(
            f"the model's rope_type {kind!r} is not converted here; export --format merged and convert that "
            "folder with llama.cpp's convert_hf_to_gguf.py"
        )


def _rope_theta(config: Any) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def _head_dim(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def _add_hyperparameters(writer: Any, config: Any, family: str, quantization: str) -> None:
    import gguf

    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_key_length(_head_dim(config))
    writer.add_value_length(_head_dim(config))
    if family == "LLAMA":
        writer.add_rope_dimension_count(_head_dim(config))
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(_file_type(quantization))
    if quantization == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _file_type(quantization: str) -> Any:
    from gguf import LlamaFileType as kinds

    return {"f32": kinds.ALL_F32, "f16": kinds.MOSTLY_F16, "bf16": kinds.MOSTLY_BF16, "q8_0": kinds.MOSTLY_Q8_0}[
        quantization
    ]


def _add_tensors(writer: Any, model: Any, arch: Any, family: str, quantization: str) -> None:
    import gguf

    names = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue  # llama.cpp reads a missing output.weight as tied to token_embd
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ExportError(f"tensor {hf_name} has no GGUF name in the {family.lower()} family; it is not converted")
        data = tensor.detach().float().cpu().numpy()
        if family == "LLAMA" and hf_name.endswith("q_proj.weight"):
            data = llama_permute(data, heads)
        elif family == "LLAMA" and hf_name.endswith("k_proj.weight"):
            data = llama_permute(data, kv_heads)
        encoded, kind = _encode(data, quantization)
        writer.add_tensor(name, encoded, raw_dtype=kind)


def llama_permute(weights: Any, heads: int) -> Any:
    """Hugging Face's q/k rows (halves rotated) in llama.cpp's order (pairs rotated), as its converter does."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _encode(data: Any, quantization: str) -> tuple[Any, Any]:
    """The tensor's bytes and GGML type: 1-D tensors stay f32; q8_0 falls back to f16 where rows do not split
    into its blocks (as llama.cpp's converter does)."""
    import gguf
    import numpy as np

    kinds = gguf.GGMLQuantizationType
    if data.ndim == 1 or quantization == "f32":
        return data.astype(np.float32), kinds.F32
    if quantization == "q8_0":
        try:
            return gguf.quants.quantize(data, kinds.Q8_0), kinds.Q8_0
        except gguf.QuantError:
            quantization = "f16"
    if quantization == "bf16":
        return gguf.quants.quantize(data, kinds.BF16), kinds.BF16
    return data.astype(np.float16), kinds.F16


def _copy_tokenizer(writer: Any, base: Path) -> None:
    """Every `tokenizer.*` field of the base model's own GGUF file, as it is."""
    import gguf

    for field in gguf.GGUFReader(base).fields.values():
        if field.name.startswith("tokenizer."):
            kind = field.types[0]
            sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)


def _add_tokenizer(writer: Any, tokenizer: Any, vocab_size: int) -> None:
    """A byte-level BPE tokenizer (tokenizer.json) as llama.cpp's "gpt2" tokenizer model."""
    import gguf

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model, decoder = spec.get("model") or {}, spec.get("decoder") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or decoder.get("type") != "ByteLevel":
        raise ExportError(
            f"the tokenizer ({model.get('type')} with a {decoder.get('type')} decoder) is not a byte-level BPE, the "
            "one tokenizer this converts; export --format merged and use llama.cpp's convert_hf_to_gguf.py"
        )
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_tokenizer(spec.get("pre_tokenizer") or {}))
    special = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
    added = {token.content for token in tokenizer.added_tokens_decoder.values()}
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    tokens, kinds = [], []
    for index in range(vocab_size):
        token = by_id.get(index)
        if token is None:
            tokens.append(f"[PAD{index}]")
            kinds.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(token)
            kinds.append(
                gguf.TokenType.CONTROL
                if token in special
                else gguf.TokenType.USER_DEFINED
                if token in added
                else gguf.TokenType.NORMAL
            )
    writer.add_token_list(tokens)
    writer.add_token_types(kinds)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])])
    for kind, token_id in (
        ("bos", tokenizer.bos_token_id),
        ("eos", tokenizer.eos_token_id),
        ("pad", tokenizer.pad_token_id),
        ("unk", tokenizer.unk_token_id),
    ):
        if token_id is not None:
            getattr(writer, f"add_{kind}_token_id")(token_id)
    bos = tokenizer.bos_token_id
    writer.add_add_bos_token(bos is not None and tokenizer("a")["input_ids"][:1] == [bos])
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def _pre_tokenizer(spec: dict[str, Any]) -> str:
    """llama.cpp's name for the tokenizer's pre-tokenizer: GPT-2's byte-level regex, or a known split pattern."""
    if spec.get("type") == "ByteLevel" and spec.get("use_regex", True):
        return "gpt2"
    steps = spec.get("pretokenizers", []) if spec.get("type") == "Sequence" else []
    patterns = [step.get("pattern", {}).get("Regex") for step in steps if step.get("type") == "Split"]
    if len(patterns) == 1 and patterns[0] in PRE_TOKENIZERS:
        return PRE_TOKENIZERS[patterns[0]]
    raise ExportError(
        f"the tokenizer's pre-tokenizer ({spec.get('type')} {patterns or ''}) is not one llama.cpp names here; "
        "export --format merged and use llama.cpp's convert_hf_to_gguf.py"
    )
