"""ART's keyword arguments translated into ours: the one place where the core meets ART's argument shapes.

`Model(...)` and `TrainableModel(...)` hand their keywords to `model_keywords` before validation, and
`RemoteBackend.train` hands ART's training options to `art_train_config`. What has an equivalent here
is mapped; what only names a W&B run or tunes ART's own Unsloth/vLLM services is accepted and
ignored; anything else is refused by name, with the setting to use instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from art_agents.errors import ArtError
from art_agents.train_config import TrainConfig

# ART's keyword arguments that only name a Weights & Biases run (and `run_name`, ART's storage name): accepted and
# ignored. The W&B reporter names its run after `name` (WANDB_ENTITY picks the entity), as do the files and the
# served name.
_RUN_LABELS = ("entity", "id", "run_id", "run_name")
# ART's LoRA settings (`lora_config`, and `_internal_config["peft_args"]` before it) mapped to ModelConfig fields.
_LORA_FIELDS = {
    "rank": "lora_rank",
    "r": "lora_rank",
    "alpha": "lora_alpha",
    "lora_alpha": "lora_alpha",
    "dropout": "lora_dropout",
    "lora_dropout": "lora_dropout",
    "target_modules": "target_modules",
    "random_state": "seed",
}
# `_internal_config["init_args"]` keys: mapped, accepted only at the value this server uses, or ignored (they only
# tune the memory and speed of ART's Unsloth/vLLM services).
_INIT_FIELDS = {"dtype": "dtype", "random_state": "seed", "gpu_memory_utilization": "gpu_memory_utilization"}
_INIT_AT = {"load_in_4bit": False, "load_in_8bit": False, "full_finetuning": False, "trust_remote_code": False}
_INIT_IGNORED = {
    "max_seq_length",
    "fast_inference",
    "disable_log_stats",
    "enable_prefix_caching",
    "use_async",
    "max_lora_rank",
    "float8_kv_cache",
    "use_gradient_checkpointing",
    "fix_tokenizer",
}
# `_internal_config["engine_args"]` (ART's vLLM engine arguments): mapped to ModelConfig's vLLM fields, or ignored
# (they only tune vLLM's memory and speed, which this server sets itself). Others are refused by name.
_ENGINE_FIELDS = {
    "gpu_memory_utilization": "gpu_memory_utilization",
    "tensor_parallel_size": "tensor_parallel_size",
    "data_parallel_size": "data_parallel_size",
    "enable_sleep_mode": "vllm_sleep_mode",
}
_ENGINE_IGNORED = {
    "enforce_eager", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "disable_log_stats",
    "num_scheduler_steps",  # an older vLLM's speed knob, still in ART's 2048 example
}  # fmt: skip
# GPU placement: ART's shared mode (the same GPUs for both, or none given) is the server's default; its dedicated
# mode (training on GPUs of its own) maps to trainer processes on those GPUs.
_PLACEMENT = ("trainer_gpu_ids", "inference_gpu_ids")

# ART's training options (its `_config` dict, `art.dev.TrainConfig`, and the keywords of its `backend.train`) that
# this trainer has, by TrainConfig field.
ART_TRAIN_FIELDS = {
    "learning_rate": "learning_rate",
    "beta": "beta",
    "kl_penalty_coef": "beta",
    "epsilon": "epsilon",
    "epsilon_high": "epsilon_high",
    "scale_rewards": "scale_rewards",
    "truncated_importance_sampling": "tis_cap",
}
_ANY = object()
# ART options accepted at the values that match what this trainer does anyway, or (_ANY) that only tune speed or
# debugging output of ART's own trainer. Other values, and every option not listed, are refused by name.
ART_TRAIN_NEUTRAL: dict[str, Any] = {
    "allow_training_without_logprobs": _ANY,  # turns without stored tokens are re-tokenized and counted here
    "precalculate_logprobs": _ANY,
    "logprob_calculation_chunk_size": _ANY,
    "plot_tensors": (False,),
    "advantage_balance": (0, 0.0),
    "scale_learning_rate_by_reward_std_dev": (False,),
    "num_trajectories_learning_rate_multiplier_power": (0, 0.0),
    "mask_prob_ratio": (False,),
    "kimi_k2_tau": (None,),
    "save_checkpoint": (True,),
}


def model_keywords(data: dict[str, Any], *, trainable: bool, owner: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`data` with ART's model keywords taken out, and the ModelConfig updates that its LoRA settings ask for.

    W&B run labels are dropped; `trainable` must match the class (`owner`); `base_path` may only be ".art"
    (the backend's folder holds the files); `report_metrics` becomes `report_to`; `lora_config` and
    `_internal_config` (a TrainableModel's only) become updates of the ModelConfig the server loads.
    """
    data = dict(data)
    for label in _RUN_LABELS:
        data.pop(label, None)
    if "trainable" in data and data.pop("trainable") is not trainable:
        raise ValueError(f"trainable must be {trainable} for {owner}; use the other class")
    if data.pop("base_path", ".art") not in (".art", None):
        raise ValueError(
            "base_path is not supported: files go under the backend's folder; pass it as LocalBackend(path=...)"
        )
    if "report_metrics" in data:
        if data.get("report_to") is not None:
            raise ValueError("give report_to or ART's report_metrics, not both")
        data["report_to"] = data.pop("report_metrics")
    art = {key: data.pop(key) for key in ("lora_config", "_internal_config") if key in data}
    if art and not trainable:
        raise ValueError(f"{' and '.join(art)} only apply to a TrainableModel")
    return data, model_config_updates(art.get("lora_config"), art.get("_internal_config"))


def model_config_updates(
    lora_config: Mapping[str, Any] | None, internal_config: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The ModelConfig fields that ART's `lora_config` and `_internal_config` set; what cannot be honoured is refused
    by name."""
    updates: dict[str, Any] = {}
    refused: list[str] = []

    def lora(section: str, values: Mapping[str, Any]) -> None:
        for key, value in values.items():
            if key in _LORA_FIELDS:
                updates[_LORA_FIELDS[key]] = value
            else:
                refused.append(f"{section}.{key}")

    lora("lora_config", lora_config or {})
    internal = dict(internal_config or {})
    trainer_gpus, inference_gpus = (internal.pop(key, None) for key in _PLACEMENT)
    for section, values in internal.items():
        if section == "engine_args" and isinstance(values, Mapping):
            refused += _engine_updates(values, updates)
        elif section == "peft_args" and isinstance(values, Mapping):
            lora("_internal_config.peft_args", values)
        elif section == "init_args" and isinstance(values, Mapping):
            for key, value in values.items():
                if key in _INIT_FIELDS:
                    updates[_INIT_FIELDS[key]] = value
                elif key in _INIT_AT and value == _INIT_AT[key]:
                    continue
                elif key not in _INIT_IGNORED:
                    refused.append(f"_internal_config.init_args.{key}={value!r}")
        elif section == "vllm_runtime" and isinstance(values, Mapping):
            refused += _runtime_updates(values, updates)
        elif section == "rollout_weight_update_mode":
            if values != "step_lora":  # what this server does: each step's LoRA, loaded between steps
                refused.append(f"_internal_config.rollout_weight_update_mode={values!r} (only 'step_lora')")
        elif values not in (None, {}, []):
            refused.append(f"_internal_config.{section}")
    if "vllm_server_url" in updates and trainer_gpus and not inference_gpus:  # ART's external mode: vLLM is elsewhere
        updates.update(trainer_processes=len(trainer_gpus), trainer_devices=[f"cuda:{g}" for g in trainer_gpus])
    else:
        refused += _placement_updates(trainer_gpus, inference_gpus, updates)
    if refused:
        raise ValueError(
            f"not supported by art-agents: {', '.join(refused)}. LoRA settings map to ModelConfig (rank, alpha, "
            "dropout, target_modules, random_state), engine_args to its vLLM fields (gpu_memory_utilization, "
            "tensor_parallel_size, data_parallel_size, enable_sleep_mode, enable_prefix_caching), separate "
            "trainer_gpu_ids to trainer processes on them; use "
            "`config=art_agents.ModelConfig(...)` for the rest (engine, dtype, device, batch size)"
        )
    return updates


def _placement_updates(trainer: list[int] | None, inference: list[int] | None, updates: dict[str, Any]) -> list[str]:
    """ART's dedicated mode as trainer processes, one per trainer GPU; what cannot be honoured.

    vLLM runs on the first tensor_parallel_size x data_parallel_size GPUs, so inference_gpu_ids must be those.
    """
    if (not trainer and not inference) or trainer == inference:
        return []
    if not trainer or not inference:
        return ["_internal_config: trainer_gpu_ids and inference_gpu_ids, one without the other"]
    serving = updates.get("tensor_parallel_size", 1) * updates.get("data_parallel_size", 1)
    if sorted(inference) != list(range(serving)):
        return [
            f"_internal_config.inference_gpu_ids={inference!r}: vLLM serves on the first tensor_parallel_size x "
            f"data_parallel_size = {serving} GPUs, {list(range(serving))}"
        ]
    if shared := sorted(set(trainer) & set(inference)):
        return [f"_internal_config.trainer_gpu_ids={trainer!r} sharing GPUs {shared} with inference_gpu_ids"]
    updates["trainer_processes"] = len(trainer)
    updates["trainer_devices"] = [f"cuda:{gpu}" for gpu in trainer]
    return []


def _runtime_updates(values: Mapping[str, Any], updates: dict[str, Any]) -> list[str]:
    """ART's `vllm_runtime`: `managed` (the default) is vLLM started by the server, `external` one at `server_url`."""
    mode = values.get("mode", "managed")
    if mode == "managed" and set(values) <= {"mode"}:
        return []
    if mode == "external" and values.get("server_url") and set(values) <= {"mode", "server_url"}:
        updates.update(engine="vllm", vllm_server_url=values["server_url"])
        return []
    return [f"_internal_config.vllm_runtime={dict(values)!r} (mode 'managed', or 'external' with a server_url)"]


def _engine_updates(values: Mapping[str, Any], updates: dict[str, Any]) -> list[str]:
    """Apply ART's `engine_args` to `updates`; the keys that cannot be honoured."""
    refused = []
    for key, value in values.items():
        if key in _ENGINE_FIELDS:
            updates[_ENGINE_FIELDS[key]] = value
        elif key == "enable_prefix_caching":
            if not value:
                updates["prefix_cache_mb"] = 0.0
        elif key not in _ENGINE_IGNORED:
            refused.append(f"_internal_config.engine_args.{key}={value!r}")
    return refused


def _art_loss(ppo: Any, given: dict[str, Any], updates: dict[str, Any]) -> list[str]:
    """ART's loss switch, as this trainer's loss (ART averages either over the step's trained tokens).

    `ppo=True`: the clipped surrogate, clip range 1 - epsilon .. 1 + epsilon_high (ART's default epsilon 0.2, as
    ours): loss="dapo". `ppo=False`: ART's CISPO, whose importance weight is clipped to 1 - epsilon .. 1 +
    epsilon_high (ART's defaults 1.0 and 4.0): loss="cispo", whose cap is epsilon_high itself, so ART's
    epsilon_high + 1; a lower clip above 0 (epsilon < 1) is refused, as this CISPO (TRL's) has none.
    """
    if ppo is True:
        updates["loss"] = "dapo"
        return []
    if ppo is not False:
        return [f"ppo={ppo!r} (True or False)"]
    updates["loss"] = "cispo"
    updates["epsilon_high"] = 1.0 + given.pop("epsilon_high", 4.0)
    if (epsilon := given.pop("epsilon", 1.0)) < 1.0:
        return [f"epsilon={epsilon!r} with ppo=False (a lower clip of CISPO's weight)"]
    return []


def art_train_config(
    config: TrainConfig | None, dev_config: Mapping[str, Any] | None = None, **options: Any
) -> TrainConfig:
    """`config` with ART's training options applied (`_config`, or `backend.train` keywords; these win).

    Mapped: learning_rate, beta / kl_penalty_coef (KL penalty), epsilon, epsilon_high, scale_rewards,
    truncated_importance_sampling (tis_cap), importance_sampling_level, normalize_by_length=False
    (loss="dr_grpo") and ppo (see `_art_loss`). Speed and debugging knobs of ART's trainer are accepted and
    ignored; anything else raises ArtError naming it.
    """
    given = {**(dev_config or {}), **options}
    updates: dict[str, Any] = {}
    refused: list[str] = []
    if "ppo" in given:
        refused += _art_loss(given.pop("ppo"), given, updates)
    for key, value in given.items():
        neutral = ART_TRAIN_NEUTRAL.get(key)
        if key in ART_TRAIN_FIELDS:
            updates[ART_TRAIN_FIELDS[key]] = value
        elif key == "importance_sampling_level" and value in ("token", "sequence", "average", "geometric_average"):
            updates["importance_sampling_level"] = value
        elif key == "normalize_by_length" and isinstance(value, bool):
            if not value and "loss" in updates:
                refused.append("normalize_by_length=False with ppo (ART averages its losses over tokens)")
            elif not value:
                updates["loss"] = "dr_grpo"
            elif (config or TrainConfig()).loss == "dr_grpo":
                refused.append("normalize_by_length=True with loss='dr_grpo'")
        elif neutral is _ANY or (neutral is not None and value in neutral):
            continue
        else:
            refused.append(f"{key}={value!r}")
    if refused:
        raise ArtError(
            f"training options not supported by art-agents: {', '.join(refused)}. Supported: "
            f"{', '.join(sorted(ART_TRAIN_FIELDS))}, importance_sampling_level, normalize_by_length, ppo; "
            "the rest of TrainConfig (loss, num_iterations, max_staleness, ...) is set with art_agents.TrainConfig(...)"
        )
    base = config or TrainConfig()
    return TrainConfig.model_validate({**base.model_dump(), **updates}) if updates else base
