"""GPU figures in one run: GRPO train tokens/s (ours vs TRL), serving tokens/s (our engine vs raw generate), vLLM.

Device command (one H200 machine, no network; `.whl` carries what its image lacks: trl, datasets, pydantic
and their small needs, plus typing_extensions 4.16 that pydantic needs; torch, transformers, peft, accelerate,
numpy, pyarrow and the rest are the machine's own):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false || exit; set -o pipefail; python3 benchmarks/gpu.py --budget-seconds 420 2>&1 | tee $OUT/gpu.txt

(run with carry [".whl"] and timeout_s 540). Make `.whl` here (`/.whl/` in .git/info/exclude; 4.5 MiB) with
`python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform
manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl trl==1.16.0
datasets==5.2.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 typing_inspection==0.4.5
typing_extensions==4.16.0 dill==0.4.1 multiprocess==0.70.19` (the versions of the project's own venv).

The repository needs no install there: when `art_agents` is not installed, the script lays it out as an
install would, in symlinks into this checkout by pyproject's `[tool.setuptools.package-dir]` (`art_agents.server`
is `server/`, and so on), and puts that folder on the path of itself and of the trainer process it starts.

What is measured, each side interleaved with the other(s) round by round after one warm-up round, each
figure the median tokens/s with its min-max over the rounds:
1. Training: a Qwen3-0.6B-shaped model (hidden 1024, 28 layers, 16/8 heads, head_dim 128, intermediate 3072,
   vocab 151936, tied embeddings; random weights: no model hub) in bf16 with the same LoRA (r 16, alpha 32,
   q/k/v/o) on every side, the same batch (8 groups x 8 completions, 128 prompt + 256 completion tokens),
   micro-batches of 8 and AdamW. Ours: the whole `PolicyTrainer.train` call (token-store look-ups,
   advantages, sequences, forward/backward, clipping, optimizer step). TRL: `GRPOTrainer.compute_loss` on
   prepared inputs, backward, clipping and optimizer step (what its training step runs once the completions
   exist). Gradient checkpointing off and on for both; when TrainConfig has no `gradient_checkpointing`
   field, ours gets it on the model (`gradient_checkpointing_enable`, non-reentrant, as TRL), and the row
   says so. tokens/s = trained (completion) tokens / step seconds.
2. Serving: `TransformersEngine` built by `load_peft_model` from the saved model, 32 concurrent
   `generate` calls of 128 tokens (temperature 1), vs raw `model.generate` on the same PEFT model with the
   same left-padded prompts (`min_new_tokens` = `max_new_tokens`). tokens/s = generated tokens / seconds
   (the engine's counted from its samples: with random weights an end-of-sequence token is rare but possible).
3. Model families: each family's tiny random model (`server/ops/family_models.py`: its real chat template and special
   tokens; no hub, so no real weights) on the GPU in bf16: a tool-offering prompt, 4 replies parsed as the server
   parses them, one GRPO step on them (seconds for the whole, and whether it ran).
4. Trainer processes: the same training step by `PolicyTrainer` in this process and by 1 trainer process
   (`ModelConfig.trainer_processes=1`, DDP over nccl on cuda:0: torch.distributed's path with one rank),
   which should match within 5%; the process's call includes handing it the LoRA and optimizer state and
   taking them back (benchmarks/trainer_processes.py, whose CPU run compares 2 processes too).
5. vLLM (only where `import vllm` works): offline `vllm.LLM` on the same saved model, the same prompts
   (ignore_eos), without and with a LoRA, and the latency of switching to a LoRA it has not loaded yet.

`--budget-seconds` (default 420) stops before the next round that would not fit and prints what it has; a
hard stop at the budget + 30 s prints the table so far and exits. `--dry-run` runs every row on CPU with a
tiny model in well under a minute (what tests/test_gpu_benchmark_script.py runs).

    python benchmarks/gpu.py [--dry-run] [--budget-seconds 420] [--rounds 5] [--sections train,serve,vllm]
"""

from __future__ import annotations

import time

_STARTED = time.monotonic()  # the budget counts imports too

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import importlib.util  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import uuid  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # run as a script or loaded by path: finds grpo_step.py
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


# --------------------------------------------------------------------------------------------- imports
def linked_package(mapping: dict[str, Path], site: Path) -> Path:
    """`art_agents` laid out as an install would be, in symlinks into this checkout: `site/art_agents/` links
    art_agents/'s entries and each subpackage of another folder (`server` -> server/); returns `site`."""
    root = mapping["art_agents"]
    package = site / "art_agents"
    package.mkdir(parents=True, exist_ok=True)
    links = {entry.name: entry for entry in root.iterdir()}
    for name, folder in mapping.items():
        parts = name.split(".")
        if len(parts) == 2 and folder != root / parts[1]:
            links[parts[1]] = folder
    for name, target in links.items():
        if not (package / name).exists():
            (package / name).symlink_to(target.resolve())
    return site


def ensure_art_agents() -> str:
    """Make `art_agents.server` importable (installed, or from this checkout); says from where."""
    try:
        if importlib.util.find_spec("art_agents.server") is not None:
            import art_agents

            return f"installed ({Path(art_agents.__file__).parent})"
    except ModuleNotFoundError as exc:
        if exc.name != "art_agents":
            raise
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = {name: ROOT / folder for name, folder in pyproject["tool"]["setuptools"]["package-dir"].items()}
    site = str(linked_package(mapping, Path(tempfile.mkdtemp(prefix="art-site-"))))
    sys.path.insert(0, site)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))  # its children
    for name in [n for n in sys.modules if n == "art_agents" or n.startswith("art_agents.")]:
        del sys.modules[name]  # a half-found copy (repo root on the path) must not shadow the linked one
    return f"this checkout, linked by pyproject's package-dir mapping ({ROOT})"


# --------------------------------------------------------------------------------------------- results
@dataclass
class Row:
    section: str
    name: str
    values: list[float] = field(default_factory=list)  # tokens/s per round (or seconds, for latencies)
    unit: str = "tok/s"
    note: str = ""
    peak_gib: float = 0.0  # the most GPU memory allocated during any of its calls

    def full_note(self) -> str:
        peak = f"peak {self.peak_gib:.1f} GiB allocated" if self.peak_gib else ""
        return "; ".join(n for n in (self.note, peak) if n)

    def cells(self) -> list[str]:
        if not self.values:
            return [self.section, self.name, "-", "-", "0", self.full_note() or "not measured"]
        digits = 0 if self.unit == "tok/s" else 1
        scale = 1000.0 if self.unit == "ms" else 1.0
        med, low, high = (f"{v * scale:,.{digits}f}" for v in _stats(self.values))
        return [self.section, self.name, f"{med} {self.unit}", f"{low}-{high}", str(len(self.values)), self.full_note()]


def _stats(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


@dataclass
class Report:
    header: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    printed: bool = False
    failures: int = 0

    def failed(self, what: str, exc: BaseException) -> None:
        """Note a failed part and go on with the others (a one-shot run should bring back all it can)."""
        import traceback

        self.failures += 1
        self.notes.append(f"FAILED {what}: {type(exc).__name__}: {str(exc)[:400]}")
        log(f"{what} failed:\n{traceback.format_exc()}")

    def row(self, section: str, name: str, unit: str = "tok/s", note: str = "") -> Row:
        row = Row(section, name, unit=unit, note=note)
        self.rows.append(row)
        return row

    def print(self, ending: str) -> None:
        if self.printed:
            return
        self.printed = True
        titles = ["section", "row", "median", "min-max", "n", "note"]
        table = [titles, *(r.cells() for r in self.rows)]
        widths = [max(len(line[i]) for line in table) for i in range(len(titles) - 1)]
        out = ["", "=" * 30 + " benchmarks/gpu.py " + "=" * 30, *self.header, ""]
        for i, line in enumerate(table):
            out.append("  ".join(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1])
            if i == 0:
                out.append("  ".join("-" * w for w in widths) + "  ----")
        out += ["", *self.notes, ending]
        sys.stdout.write("\n".join(out) + "\n")
        sys.stdout.flush()


REPORT = Report()


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = _STARTED + seconds
        self.stopped: str | None = None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, seconds: float, what: str) -> bool:
        """Whether `seconds` more (with a margin) still fit; the first refusal is noted."""
        if self.left() > seconds * 1.25 + 5:
            return True
        self.stopped = f"stopped by --budget-seconds before {what} ({self.left():.0f} s left)"
        REPORT.notes.append(self.stopped)
        log(self.stopped)
        return False


def log(message: str) -> None:
    print(f"[{time.monotonic() - _STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


def interleaved(
    sides: list[tuple[Row, Callable[[], float]]], rounds: int, budget: Budget, label: str, device: str, warmup: int = 1
) -> None:
    """Each side once per round (a warm-up round first); a side returns its figure (tok/s or seconds)."""
    import torch

    cuda = device.startswith("cuda")
    last: dict[int, float] = {}
    for r in range(warmup + rounds):
        estimate = sum(last.values()) if last else 0.0
        if r > 0 and not budget.allows(estimate, f"{label} round {r}"):
            return
        for i, (row, side) in enumerate(sides):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            started = time.monotonic()
            value = side()
            last[i] = time.monotonic() - started
            if cuda:
                row.peak_gib = max(row.peak_gib, torch.cuda.max_memory_allocated() / 2**30)
            if r >= warmup:
                row.values.append(value)
        log(f"{label} round {r}{' (warm-up)' if r < warmup else ''}: {_round_line(sides, r >= warmup)}")


def _round_line(sides: list[tuple[Row, Callable[[], float]]], measured: bool) -> str:
    if not measured:
        return "done"
    return ", ".join(f"{row.name.split(' ')[0]}={row.values[-1]:,.3g}" for row, _ in sides if row.values)


# --------------------------------------------------------------------------------------------- set-up
@dataclass(frozen=True)
class Sizes:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    groups: int
    group_size: int
    prompt_tokens: int
    completion_tokens: int
    micro_batch: int
    requests: int
    serve_prompt_tokens: int
    serve_tokens: int
    rounds: int
    section_seconds: float  # the least a section's set-up and warm-up round take: none starts with less left


GPU_SIZES = Sizes(
    hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072, vocab=151936,
    groups=8, group_size=8, prompt_tokens=128, completion_tokens=256, micro_batch=8,
    requests=32, serve_prompt_tokens=128, serve_tokens=128, rounds=5, section_seconds=30.0,
)  # fmt: skip
TINY_SIZES = Sizes(
    hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=1024,
    groups=2, group_size=4, prompt_tokens=16, completion_tokens=16, micro_batch=4,
    requests=4, serve_prompt_tokens=16, serve_tokens=8, rounds=2, section_seconds=3.0,
)  # fmt: skip


def build_model(work: Path, sizes: Sizes, device: str, dtype: Any) -> tuple[Path, Any, int]:
    """A random Qwen3 model of `sizes` and the tiny model's tokenizer (ids < vocab), saved; its folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    from art_agents.server.ops.tiny_model import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(work / "tokenizer-source"))
    if len(tokenizer) > sizes.vocab:
        raise SystemExit(f"the tokenizer has {len(tokenizer)} tokens, more than the model's vocab {sizes.vocab}")
    config = Qwen3Config(
        vocab_size=sizes.vocab, hidden_size=sizes.hidden, intermediate_size=sizes.intermediate,
        num_hidden_layers=sizes.layers, num_attention_heads=sizes.heads, num_key_value_heads=sizes.kv_heads,
        head_dim=sizes.head_dim, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    config.rope_theta = 1_000_000.0
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path = work / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    del model
    return path, tokenizer, params


def lora_config() -> Any:
    """The LoRA of `load_peft_model` with ModelConfig's defaults (r 16, alpha 32, q/k/v/o), for every side."""
    from peft import LoraConfig

    from art_agents.train_config import ModelConfig

    defaults = ModelConfig()
    assert list(defaults.target_modules) == LORA_TARGETS and defaults.lora_rank == 16, defaults
    return LoraConfig(
        r=defaults.lora_rank,
        lora_alpha=defaults.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(defaults.target_modules),
        task_type="CAUSAL_LM",
    )


def load_base(path: Path, device: str, dtype: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)


def make_rows(tokenizer: Any, sizes: Sizes, seed: int = 0) -> list[dict[str, Any]]:
    """Group-major rows: one random prompt per group, random completions ending in eos, a random reward."""
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    rows = []
    for g in range(sizes.groups):
        prompt = [rng.choice(vocab) for _ in range(sizes.prompt_tokens)]
        for _ in range(sizes.group_size):
            completion = [rng.choice(vocab) for _ in range(sizes.completion_tokens - 1)] + [tokenizer.eos_token_id]
            rows.append({"group": g, "prompt_ids": prompt, "completion_ids": completion, "reward": rng.random()})
    return rows


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def enable_checkpointing(peft_model: Any) -> None:
    """Gradient checkpointing on the model as TRL sets it for a PEFT model (non-reentrant, inputs need grads)."""
    peft_model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    peft_model.base_model.model.enable_input_require_grads()
    peft_model.base_model.model.config.use_cache = False


def checkpointing_active(model: Any) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


# --------------------------------------------------------------------------------------------- training
def ours_side(
    path: Path, tokenizer: Any, rows: list[dict[str, Any]], sizes: Sizes, device: str, dtype: Any, work: Path,
    checkpointing: bool,
) -> tuple[Callable[[], float], str]:  # fmt: skip
    """A `PolicyTrainer.train` step on `rows` (tokens/s per call), and how checkpointing was set."""
    from grpo_step import stored_groups
    from peft import get_peft_model

    from art_agents.server.storage.token_store import TokenStore
    from art_agents.server.training.trainer import PolicyTrainer
    from art_agents.train_config import TrainConfig

    store = TokenStore(work / f"store-{uuid.uuid4().hex[:8]}.sqlite")
    groups = stored_groups(tokenizer, rows, store)
    model = get_peft_model(load_base(path, device, dtype), lora_config())
    trainer = PolicyTrainer(model, tokenizer, store)
    config = TrainConfig(
        learning_rate=1e-5,
        micro_batch_size=sizes.micro_batch,
        max_completion_tokens=sizes.completion_tokens,
        gradient_checkpointing=checkpointing,
    )

    def step() -> float:
        synchronize(device)
        started = time.perf_counter()
        metrics = trainer.train(groups, config)
        synchronize(device)
        return metrics["tokens_trained"] / (time.perf_counter() - started)

    return step, "TrainConfig.gradient_checkpointing" if checkpointing else ""


def trl_side(
    tokenizer: Any, rows: list[dict[str, Any]], sizes: Sizes, path: Path, device: str, dtype: Any, work: Path,
    checkpointing: bool,
) -> tuple[Callable[[], float], str]:  # fmt: skip
    """TRL's GRPOTrainer loss + backward + clip + AdamW step on the same rows (tokens/s per call)."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    on_gpu = device.startswith("cuda")
    args = GRPOConfig(
        output_dir=str(work / f"trl-{uuid.uuid4().hex[:8]}"), use_cpu=not on_gpu, bf16=on_gpu and dtype == torch.bfloat16,
        per_device_train_batch_size=sizes.micro_batch, num_generations=sizes.group_size,
        max_completion_length=sizes.completion_tokens, learning_rate=1e-5, beta=0.0, loss_type="grpo",
        max_grad_norm=1.0, report_to=[], logging_steps=1_000_000, gradient_checkpointing=checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=load_base(path, device, dtype),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * sizes.group_size}),
        processing_class=tokenizer,
        peft_config=lora_config(),
    )
    model = trainer.model
    how = ""
    if checkpointing and not checkpointing_active(model):  # transformers' Trainer.train() turns it on, not __init__
        enable_checkpointing(model)
        how = "gc set on the model as Trainer.train() would"
    if checkpointing_active(model) != checkpointing:
        raise RuntimeError(f"gradient checkpointing should be {checkpointing} on TRL's model")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    target = params[0].device
    optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
    rewards = torch.tensor([r["reward"] for r in rows]).view(-1, sizes.group_size)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / rewards.std(1, unbiased=False, keepdim=True)).flatten()
    batches = []
    for start in range(0, len(rows), sizes.micro_batch):
        chunk = rows[start : start + sizes.micro_batch]
        prompt = torch.tensor([r["prompt_ids"] for r in chunk], device=target)  # one prompt length: no padding
        completion = torch.tensor([r["completion_ids"] for r in chunk], device=target)
        batches.append(
            {
                "prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
                "completion_mask": torch.ones_like(completion),
                "advantages": advantages[start : start + sizes.micro_batch].to(target),
            }
        )  # fmt: skip
    trainer.current_gradient_accumulation_steps = len(batches)
    trained = sum(int(b["completion_mask"].sum()) for b in batches)

    def step() -> float:
        synchronize(device)
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for inputs in batches:
            trainer.compute_loss(model, inputs).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        synchronize(device)
        return trained / (time.perf_counter() - started)

    return step, how


def train_section(
    path: Path, tokenizer: Any, sizes: Sizes, device: str, dtype: Any, work: Path, budget: Budget
) -> None:
    rows = make_rows(tokenizer, sizes)
    trained = len(rows) * sizes.completion_tokens
    REPORT.notes.append(
        f"train batch: {sizes.groups} groups x {sizes.group_size} completions, prompt {sizes.prompt_tokens} + "
        f"completion {sizes.completion_tokens} tokens ({trained:,} trained tokens a step), micro-batch "
        f"{sizes.micro_batch}, LoRA r16 q/k/v/o, AdamW; ours = whole PolicyTrainer.train call, TRL = "
        "compute_loss + backward + clip + step on prepared inputs"
    )
    for checkpointing in (False, True):
        label = f"train gc {'on' if checkpointing else 'off'}"
        if not budget.allows(sizes.section_seconds, label):
            return
        gc_text = "gc on" if checkpointing else "gc off"
        ours_row = REPORT.row("train", f"ours PolicyTrainer ({gc_text})")
        trl_row = REPORT.row("train", f"TRL GRPOTrainer ({gc_text})")
        try:
            log(f"{label}: building both trainers")
            ours, ours_row.note = ours_side(path, tokenizer, rows, sizes, device, dtype, work, checkpointing)
            trl, trl_row.note = trl_side(tokenizer, rows, sizes, path, device, dtype, work, checkpointing)
            interleaved([(ours_row, ours), (trl_row, trl)], sizes.rounds, budget, label, device)
            del ours, trl
        except Exception as exc:
            REPORT.failed(label, exc)
        _ratio_note(ours_row, trl_row, f"train {gc_text}")
        free(device)


def _ratio_note(ours: Row, peer: Row, what: str) -> None:
    n = min(len(ours.values), len(peer.values))
    if n:
        ratios = [a / b for a, b in zip(ours.values[:n], peer.values[:n], strict=True)]
        med, low, high = _stats(ratios)
        REPORT.notes.append(f"{what}: ours / {peer.name.split(' (')[0]} tokens/s = {med:.2f}x ({low:.2f}-{high:.2f})")


def free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def processes_section(path: Path, tokenizer: Any, sizes: Sizes, device: str, work: Path, budget: Budget) -> None:
    from trainer_processes import trainer_sides

    from art_agents.train_config import TrainConfig

    if not budget.allows(sizes.section_seconds * 2, "trainer processes"):
        return
    rows = make_rows(tokenizer, sizes)
    config = TrainConfig(
        learning_rate=1e-5, micro_batch_size=sizes.micro_batch, max_completion_tokens=sizes.completion_tokens
    )
    alone = REPORT.row("processes", "ours in this process")
    one = REPORT.row("processes", "ours in 1 trainer process", note="its memory is its process's: not tracked")
    log("trainer processes: loading the model and starting the process")
    sides, stop = trainer_sides(path, rows, config, device, work / "processes", ["in-process", "1"])
    try:
        interleaved([(alone, sides["in-process"]), (one, sides["1"])], sizes.rounds, budget, "processes", device)
    finally:
        stop()
    one.peak_gib = 0.0  # what this process held meanwhile, not the trainer process's peak
    n = min(len(alone.values), len(one.values))
    if n:
        med, low, high = _stats([a / b for a, b in zip(one.values[:n], alone.values[:n], strict=True)])
        REPORT.notes.append(f"1 trainer process / this process tokens/s = {med:.2f}x ({low:.2f}-{high:.2f})")


# --------------------------------------------------------------------------------------------- serving
def serve_prompts(tokenizer: Any, sizes: Sizes, seed: int = 1) -> list[list[int]]:
    """Random prompts of 50-100% of `serve_prompt_tokens`, so the batch is left-padded as in real use."""
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    lengths = [
        rng.randint(max(1, sizes.serve_prompt_tokens // 2), sizes.serve_prompt_tokens) for _ in range(sizes.requests)
    ]
    return [[rng.choice(vocab) for _ in range(n)] for n in lengths]


def serve_section(path: Path, sizes: Sizes, device: str, dtype_name: str, budget: Budget) -> None:
    import torch

    from art_agents.server.engines.protocol import SamplingParams
    from art_agents.server.engines.transformers_engine import TransformersEngine
    from art_agents.train_config import ModelConfig

    if not budget.allows(sizes.section_seconds, "serving"):
        return
    log("serve: loading the engine (load_peft_model)")
    config = ModelConfig(
        device=device, dtype=dtype_name, max_batch_size=sizes.requests, max_queued_requests=max(256, sizes.requests)
    )
    engine = TransformersEngine.load(str(path), config)
    tokenizer, model = engine.tokenizer, engine.model
    prompts = serve_prompts(tokenizer, sizes)
    params = SamplingParams(max_tokens=sizes.serve_tokens, n=1, temperature=1.0)
    stops = {"eos": 0}
    loop = asyncio.new_event_loop()

    async def all_requests() -> list[Any]:
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    def ours() -> float:
        synchronize(device)
        started = time.perf_counter()
        results = loop.run_until_complete(all_requests())
        synchronize(device)
        seconds = time.perf_counter() - started
        samples = [s for r in results for s in r]
        stops["eos"] += sum(s.finish_reason == "stop" for s in samples)
        return sum(len(s.token_ids) for s in samples) / seconds

    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)

    def raw() -> float:
        synchronize(device)
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids, attention_mask=attention, max_new_tokens=sizes.serve_tokens,
                min_new_tokens=sizes.serve_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                pad_token_id=pad,
            )  # fmt: skip
        synchronize(device)
        seconds = time.perf_counter() - started
        return (out.shape[1] - width) * out.shape[0] / seconds

    sides = [
        (REPORT.row("serve", f"ours TransformersEngine ({sizes.requests} concurrent generate)"), ours),
        (REPORT.row("serve", f"raw HF model.generate (batch {sizes.requests})"), raw),
    ]
    try:
        interleaved(sides, sizes.rounds, budget, "serve", device)
    finally:
        loop.run_until_complete(engine.close())
        loop.close()
    if stops["eos"]:
        sides[0][0].note = f"{stops['eos']} samples ended at eos (tokens counted)"
    _ratio_note(sides[0][0], sides[1][0], "serve")
    REPORT.notes.append(
        f"serve: {sizes.requests} requests, prompts {sizes.serve_prompt_tokens // 2}-{sizes.serve_prompt_tokens} "
        f"tokens (left-padded), {sizes.serve_tokens} new tokens each, temperature 1, same PEFT model (LoRA active)"
    )


# --------------------------------------------------------------------------------------------- families
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def families_section(device: str, dtype_name: str, work: Path, budget: Budget) -> None:
    """Each family's tiny random model (its real chat template and special tokens) on the device: a tool-offering
    prompt rendered, 4 replies sampled and parsed as the server does, and one GRPO step on them."""
    from art_agents.capture import record_completion
    from art_agents.server.chat_format import parse_assistant, render_prompt_ids
    from art_agents.server.engines.protocol import SamplingParams
    from art_agents.server.engines.transformers_engine import TransformersEngine
    from art_agents.server.ops.family_models import FAMILIES, build_family_model
    from art_agents.server.storage.token_store import TokenRecord, TokenStore
    from art_agents.server.training.policy_model import PolicyModel
    from art_agents.server.training.trainer import PolicyTrainer
    from art_agents.train_config import ModelConfig, TrainConfig
    from art_agents.trajectory import Trajectory, TrajectoryGroup

    loop = asyncio.new_event_loop()
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    for family in FAMILIES:
        if not budget.allows(10.0, f"family {family}"):
            break
        row = REPORT.row("families", f"{family}: 4 replies + 1 train step", unit="s")
        engine = None
        try:
            path = build_family_model(work / "families" / family, family)
            config = ModelConfig(device=device, dtype=dtype_name, lora_rank=8)
            engine = TransformersEngine.load(str(path), config)
            store = TokenStore(work / "families" / f"{family}.sqlite")
            prompt = render_prompt_ids(engine.tokenizer, messages, [WEATHER_TOOL])
            started = time.perf_counter()
            params = SamplingParams(max_tokens=32, n=4, temperature=1.0)
            trajectories = []
            for i, sample in enumerate(loop.run_until_complete(engine.generate(prompt, params))):
                reply = parse_assistant(engine.tokenizer, sample.text, sample.token_ids, prompt, [WEATHER_TOOL])
                cid = f"chatcmpl-{family}-{i}"
                record = TokenRecord(
                    completion_id=cid, model=family, policy_step=0, prompt_ids=prompt, completion_ids=sample.token_ids,
                    logprobs=sample.logprobs, temperature=sample.temperature,
                )  # fmt: skip
                store.add(record)
                trajectories.append(Trajectory(reward=float(i % 2)))
                record_completion(messages, reply, completion_id=cid, trajectory=trajectories[-1])
            policy = PolicyModel.load(str(path), config, engine.tokenizer, engine.base_weights())
            metrics = PolicyTrainer(policy.model, engine.tokenizer, store).train(
                [TrajectoryGroup(trajectories)], TrainConfig(learning_rate=1e-4)
            )
            synchronize(device)
            row.values.append(time.perf_counter() - started)
            row.note = f"{metrics['tokens_trained']:.0f} tokens trained, loss {metrics['loss']:+.3f}, {dtype_name}"
        except Exception as exc:
            REPORT.failed(f"family {family}", exc)
        finally:
            if engine is not None:
                loop.run_until_complete(engine.close())
            free(device)
    loop.close()


# --------------------------------------------------------------------------------------------- vLLM
def vllm_section(path: Path, tokenizer: Any, sizes: Sizes, device: str, budget: Budget, eager: bool) -> None:
    if importlib.util.find_spec("vllm") is None:
        REPORT.notes.append("vLLM: not installed, rows skipped")
        log("vLLM: not installed, rows skipped")
        return
    if not device.startswith("cuda"):
        REPORT.notes.append("vLLM: installed but no CUDA device, rows skipped")
        return
    if not budget.allows(4 * sizes.section_seconds, "vLLM (start-up can take minutes)"):
        return
    try:
        _vllm_rows(path, tokenizer, sizes, budget, eager)
    except Exception as exc:  # a broken vLLM must not take the other rows down
        REPORT.notes.append(f"vLLM: failed: {type(exc).__name__}: {str(exc)[:300]}")
        log(f"vLLM failed: {exc!r}")


def _vllm_rows(path: Path, tokenizer: Any, sizes: Sizes, budget: Budget, eager: bool) -> None:
    import torch
    from peft import get_peft_model
    from vllm import LLM
    from vllm import SamplingParams as VllmSampling
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    adapters = []
    peft_model = get_peft_model(load_base(path, "cpu", torch.bfloat16), lora_config())
    for i in range(4):  # distinct adapters (B != 0, so each changes the output)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 1e-3, generator=torch.Generator().manual_seed(i))
        folder = path.parent / f"adapter-{i}"
        peft_model.save_pretrained(folder)
        adapters.append(str(folder))
    del peft_model
    log("vLLM: starting the offline engine")
    started = time.monotonic()
    llm = LLM(
        model=str(path), tokenizer=str(path), dtype="bfloat16", enable_lora=True, max_lora_rank=16, max_loras=2,
        max_model_len=2048, gpu_memory_utilization=0.35, enforce_eager=eager, seed=0,
    )  # fmt: skip
    REPORT.notes.append(f"vLLM: engine start-up {time.monotonic() - started:.0f} s (enforce_eager={eager})")
    prompts = [TokensPrompt(prompt_token_ids=p) for p in serve_prompts(tokenizer, sizes)]
    params = VllmSampling(  # no detokenizing: the random model samples ids past the small tokenizer's vocab
        max_tokens=sizes.serve_tokens, min_tokens=sizes.serve_tokens, ignore_eos=True, temperature=1.0, detokenize=False
    )
    first = LoRARequest("adapter-0", 1, adapters[0])

    def run(lora: Any) -> float:
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - started)

    sides = [
        (REPORT.row("vllm", f"raw vLLM base ({sizes.requests} prompts)"), lambda: run(None)),
        (REPORT.row("vllm", f"raw vLLM + LoRA ({sizes.requests} prompts)"), lambda: run(first)),
    ]
    interleaved(sides, sizes.rounds, budget, "vllm", "vllm")  # its memory is its engine process's: not tracked
    one = VllmSampling(max_tokens=1, temperature=1.0, detokenize=False)
    swap = REPORT.row("vllm", "LoRA swap: first request on a new adapter", unit="ms", note="minus a loaded one's")
    for i in range(1, len(adapters)):
        if not budget.allows(10.0, "vLLM LoRA swap"):
            break
        llm.generate(prompts[:1], one, lora_request=first, use_tqdm=False)  # loaded: the baseline
        started = time.perf_counter()
        llm.generate(prompts[:1], one, lora_request=first, use_tqdm=False)
        loaded = time.perf_counter() - started
        fresh = LoRARequest(f"adapter-{i}", 1 + i, adapters[i])  # a new id: vLLM loads it from disk
        started = time.perf_counter()
        llm.generate(prompts[:1], one, lora_request=fresh, use_tqdm=False)
        swap.values.append(time.perf_counter() - started - loaded)


# --------------------------------------------------------------------------------------------- main
def versions() -> str:
    import importlib.metadata as metadata

    found = []
    names = ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "pyarrow", "pydantic", "vllm")
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found.append(f"{name} {metadata.version(name)}")
    return ", ".join(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", "--tiny", action="store_true", help="every row on CPU with a tiny model")
    parser.add_argument("--budget-seconds", type=float, default=420.0, help="stop cleanly before this (imports count)")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds per side (5; 2 with --dry-run)")
    parser.add_argument(
        "--sections",
        default="train,processes,serve,families,vllm",
        help="comma-separated: train, processes, serve, families, vllm",
    )
    parser.add_argument("--device", default="auto", help="auto: cuda when available (cpu with --dry-run)")
    parser.add_argument("--vllm-eager", action="store_true", help="vLLM without CUDA graphs (faster start-up)")
    options = parser.parse_args()
    sections = {s.strip() for s in options.sections.split(",") if s.strip()}
    budget = Budget(options.budget_seconds)

    def hard_stop(signum: int, frame: Any) -> None:
        REPORT.notes.append(f"hard stop at {time.monotonic() - _STARTED:.0f} s: the figures above are all there are")
        REPORT.print("INCOMPLETE")
        os._exit(3)

    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, hard_stop)
        signal.alarm(max(1, int(options.budget_seconds - (time.monotonic() - _STARTED) + 30)))

    source = ensure_art_agents()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5's checkpointing renames
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    device = options.device
    if device == "auto":
        device = "cpu" if options.dry_run or not torch.cuda.is_available() else "cuda"
    sizes = TINY_SIZES if options.dry_run else GPU_SIZES
    if options.rounds is not None:
        sizes = Sizes(**{**sizes.__dict__, "rounds": options.rounds})
    dtype_name = "bfloat16" if device.startswith("cuda") else "float32"
    dtype = getattr(torch, dtype_name)
    where = torch.cuda.get_device_name() if device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    REPORT.header += [
        f"device: {device} ({where}), {dtype_name}{'  [DRY RUN: tiny model]' if options.dry_run else ''}",
        f"python {sys.version.split()[0]}; {versions()}",
        f"art_agents from {source}",
    ]
    log("\n".join(REPORT.header))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            log("building the random model")
            path, tokenizer, params = build_model(work, sizes, device, dtype)
            REPORT.header.append(
                f"model: random Qwen3, {params / 1e6:,.1f}M parameters (hidden {sizes.hidden}, {sizes.layers} layers, "
                f"{sizes.heads}/{sizes.kv_heads} heads x {sizes.head_dim}, vocab {sizes.vocab}, tied), tokenizer of "
                f"{len(tokenizer)} tokens"
            )
            parts: list[tuple[str, Callable[[], None]]] = [
                ("train", lambda: train_section(path, tokenizer, sizes, device, dtype, work, budget)),
                ("processes", lambda: processes_section(path, tokenizer, sizes, device, work, budget)),
                ("serve", lambda: serve_section(path, sizes, device, dtype_name, budget)),
                ("families", lambda: families_section(device, dtype_name, work, budget)),
                ("vllm", lambda: vllm_section(path, tokenizer, sizes, device, budget, options.vllm_eager)),
            ]
            for name, part in parts:
                if name in sections:
                    try:
                        part()
                    except Exception as exc:
                        REPORT.failed(name, exc)
                    free(device)
    except BaseException as exc:
        REPORT.failed("set-up", exc)
        REPORT.print("INCOMPLETE")
        raise SystemExit(1) from exc
    if hasattr(signal, "SIGALRM"):
        signal.alarm(0)
    REPORT.notes.append(f"total {time.monotonic() - _STARTED:.0f} s (budget {options.budget_seconds:.0f} s)")
    if REPORT.failures:
        REPORT.print(f"DONE WITH {REPORT.failures} FAILURE(S)")
        raise SystemExit(1)
    REPORT.print("INCOMPLETE (budget)" if budget.stopped else "DONE")


if __name__ == "__main__":
    main()
