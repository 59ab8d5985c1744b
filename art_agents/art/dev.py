"""ART's `art.dev` typed configs, so `art.dev.InternalModelConfig(init_args=art.dev.InitArgs(...))` runs as written.

They are typed dicts, as in ART: calling one builds a plain dict, which `arguments.py` reads key by key when the
model is registered (`TrainableModel(_internal_config=...)`, or `model._internal_config = ...` set afterwards) or
trained (`model.train(..., _config=art.dev.TrainConfig(...))`). Each key is mapped to this project's setting,
accepted at the value this server uses anyway, or refused by name: see `arguments.py` for which is which. The keys
declared below are those ART programs set most; any other key is read the same way.
"""

from __future__ import annotations

from typing import Literal, TypedDict


class InitArgs(TypedDict, total=False):
    """How ART's Unsloth service loads the base model."""

    max_seq_length: int
    dtype: str | None
    load_in_4bit: bool
    load_in_8bit: bool
    full_finetuning: bool
    trust_remote_code: bool
    gpu_memory_utilization: float
    fast_inference: bool
    enable_prefix_caching: bool
    use_gradient_checkpointing: str
    random_state: int
    max_lora_rank: int


class EngineArgs(TypedDict, total=False):
    """vLLM engine arguments of ART's managed vLLM."""

    gpu_memory_utilization: float
    enforce_eager: bool
    max_model_len: int
    max_num_seqs: int
    enable_prefix_caching: bool
    tensor_parallel_size: int
    data_parallel_size: int
    enable_sleep_mode: bool
    max_num_batched_tokens: int
    disable_log_stats: bool
    num_scheduler_steps: int


class PeftArgs(TypedDict, total=False):
    """The LoRA settings of ART releases before `lora_config` (`_internal_config["peft_args"]`)."""

    r: int
    lora_alpha: int
    lora_dropout: float
    target_modules: list[str]
    random_state: int


class LoRAConfig(TypedDict, total=False):
    """`TrainableModel(lora_config=...)`."""

    rank: int
    alpha: int
    dropout: float
    target_modules: list[str]
    random_state: int


class TrainerArgs(TypedDict, total=False):
    """Hugging Face `TrainingArguments` of ART's trainer."""

    learning_rate: float
    gradient_checkpointing: bool
    max_grad_norm: float
    weight_decay: float


class VllmRuntimeConfig(TypedDict, total=False):
    """ART 0.5's `vllm_runtime`: `managed` (vLLM started by the server) or `external` (one at `server_url`)."""

    mode: Literal["managed", "external"]
    server_url: str


class InternalModelConfig(TypedDict, total=False):
    """`TrainableModel._internal_config`."""

    init_args: InitArgs
    engine_args: EngineArgs
    peft_args: PeftArgs
    trainer_args: TrainerArgs
    trainer_gpu_ids: list[int]
    inference_gpu_ids: list[int]
    vllm_runtime: VllmRuntimeConfig
    rollout_weight_update_mode: Literal["step_lora", "in_flight_lora"]


class TrainConfig(TypedDict, total=False):
    """ART's `_config` of `model.train` (its dev training options)."""

    learning_rate: float
    beta: float
    kl_penalty_coef: float
    ppo: bool
    advantage_balance: float
    epsilon: float
    epsilon_high: float
    scale_rewards: bool
    truncated_importance_sampling: float
    importance_sampling_level: Literal["token", "sequence", "average", "geometric_average"]
    normalize_by_length: bool
    allow_training_without_logprobs: bool
    precalculate_logprobs: bool
    logprob_calculation_chunk_size: int


class TrainSFTConfig(TypedDict, total=False):
    """ART's experimental SFT options (it declares none)."""
