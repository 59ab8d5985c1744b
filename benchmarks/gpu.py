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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path: finds its siblings
import argparse
import contextlib
import importlib.util
import os
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_report import REPORT, Budget, log
from gpu_report import STARTED as _STARTED
from gpu_serve import families_section, serve_section, vllm_section
from gpu_train import GPU_SIZES, TINY_SIZES, Sizes, build_model, free, processes_section, train_section

ROOT = Path(__file__).resolve().parents[1]


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


# --------------------------------------------------------------------------------------------- main
def versions() -> str:
    import importlib.metadata as metadata

    found = []
    names = ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "pyarrow", "pydantic", "vllm")
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found.append(f"{name} {metadata.version(name)}")
    return ", ".join(found)


def parse_options() -> argparse.Namespace:
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
    return parser.parse_args()


def arm_hard_stop(budget_seconds: float) -> None:
    """At the budget + 30 s, print the table so far and exit (where SIGALRM exists)."""

    def hard_stop(signum: int, frame: Any) -> None:
        REPORT.notes.append(f"hard stop at {time.monotonic() - _STARTED:.0f} s: the figures above are all there are")
        REPORT.print("INCOMPLETE")
        os._exit(3)

    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, hard_stop)
        signal.alarm(max(1, int(budget_seconds - (time.monotonic() - _STARTED) + 30)))


def main() -> None:
    options = parse_options()
    sections = {s.strip() for s in options.sections.split(",") if s.strip()}
    budget = Budget(options.budget_seconds)
    arm_hard_stop(options.budget_seconds)
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
