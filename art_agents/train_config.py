"""Every RL training and model knob in one place, with its default and why (SFT's: sft_config.py).

The server logs the full `TrainConfig` with every step (`history.jsonl`), so a result can always be
traced to the settings that produced it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from art_agents.schema import Schema

LossType = Literal["grpo", "dr_grpo", "dapo", "cispo"]
# A learning rate as a pydantic constraint, refused in its standard words like every bound in this file. A rate may be
# 0 (where a decayed schedule ends); NaN and inf pass a `ge` bound, so they are refused by name.
Rate = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class TrainConfig(Schema):
    """GRPO settings for one `train` call. Defaults suit LoRA fine-tuning of small chat models."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float = Field(
        5e-4,
        gt=0,
        description=(
            "AdamW learning rate for the LoRA weights. With a rank-16 LoRA on SmolLM2-135M (benchmarks/learning.py, "
            "5 updates, one run each) 5e-4 raised the held-out reward by 41.9 points and 5e-5 by 17.6; 2e-3 "
            "unlearned the format. Start lower (1e-4 to 5e-5) for models of several billion parameters, and lower "
            "it when the reward collapses."
        ),
    )
    loss: LossType = Field(
        "grpo",
        description=(
            "`grpo`: token losses averaged per sequence, then over sequences (DeepSeekMath). "
            "`dr_grpo`: token losses summed and divided by a constant (`max_completion_tokens`), no "
            "length bias (Dr. GRPO). `dapo`: token losses averaged over all tokens of the batch (DAPO). "
            "`cispo`: REINFORCE on each token's logprob weighted by its importance ratio capped at `epsilon_high` "
            "(the weight carries no gradient, so no token's gradient is clipped away; MiniMax-M1, TRL's `cispo`, "
            "ART's default loss), averaged over all tokens of the batch as `dapo`. The default stays `grpo`: the "
            "learning figures in docs/learning.md were measured with it."
        ),
    )
    importance_sampling_level: Literal["token", "sequence", "average", "geometric_average"] = Field(
        "token",
        description=(
            "`token`: each token's own importance ratio. `sequence` (GSPO, TRL's and ART's name): one ratio per "
            "trained sequence, exp of the mean log-ratio of its trained tokens, for every token of it; with "
            "GSPO's small clip ranges (epsilon 3e-4, epsilon_high 4e-4). `average` and `geometric_average` "
            "(ART's): the arithmetic or geometric mean of a token's own ratio and its sequence's."
        ),
    )
    epsilon: float = Field(0.2, ge=0, description="Lower clip range of the importance ratio: 1 - epsilon.")
    epsilon_high: float | None = Field(
        None,
        ge=0,
        description=(
            "Upper clip range: 1 + epsilon_high. None means `epsilon` (DAPO uses 0.28). For `cispo` it is the cap "
            "of the ratio itself, and must be given (TRL's docs use 5.0, ART 4.0)."
        ),
    )
    beta: float = Field(
        0.0,
        ge=0,
        description=(
            "Per-token KL penalty (k3, weighted by the ratio as TRL) to the base model (adapter off), or to "
            "`reference_step`; 0 skips it."
        ),
    )
    reference_step: int | None = Field(
        None,
        ge=0,
        description=(
            "The checkpoint `beta`'s KL is taken to instead of the base model: the SFT warmup's step, say, so RL "
            "cannot drift from what the warmup taught. The trainer keeps its adapter in memory. None: the base."
        ),
    )
    self_distill: float = Field(
        0.0,
        ge=0,
        description=(
            "Weight of the per-token reverse KL from the policy to a teacher that also sees the trajectory's `hint` "
            "(a reference answer, a judge's feedback) and scores the policy's own sampled tokens: a signal for every "
            "token, not one number per rollout. Hinted trajectories of groups with equal rewards train on it too. "
            "Trajectories without a hint train as without it. 0: off."
        ),
    )
    self_distill_only: bool = Field(
        False,
        description="Train on the self-distillation term alone: advantages are 0, only hinted trajectories train.",
    )
    teacher: Literal["self", "base"] | int = Field(
        "self",
        description=(
            "Who scores with the hint: `self`, the policy at the start of the step; `base`, the base model "
            "(adapter off); or a step number, that checkpoint of this model (kept in memory as `reference_step`)."
        ),
    )
    scale_rewards: bool = Field(
        True,
        description="Divide advantages by the group's reward std (sample std, + 1e-4 as TRL) (GRPO); off for Dr. GRPO.",
    )
    num_iterations: int = Field(
        1,
        ge=1,
        description=(
            "Optimizer steps on the same batch per train call (mu in the GRPO paper); importance ratios are taken "
            "against the policy at the start of the call, so with 1 the ratio is 1 (plain policy gradient)."
        ),
    )
    micro_batch_size: int = Field(8, ge=1, description="Sequences per forward/backward pass; gradients accumulate.")
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description=(
            "Also cap a micro-batch's padded tokens (sequences x the longest one), so a batch of long sequences "
            "fits in memory while short ones still batch by `micro_batch_size`; a longer sequence trains alone. "
            "None: no cap."
        ),
    )
    truncate_to_context: bool = Field(
        False,
        description=(
            "A sequence longer than the model's context is refused by name (a 400). True cuts it to the context "
            "instead (the completion tokens past it do not train) and counts such turns as `turns_truncated`."
        ),
    )
    gradient_checkpointing: bool = Field(
        False,
        description=(
            "Recompute activations during backward instead of keeping them (non-reentrant, as TRL): much less "
            "activation memory (a GPU shared with vLLM, long sequences) for roughly a third more time."
        ),
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_completion_tokens: int = Field(
        1024, ge=1, description="Normaliser of `dr_grpo` (the generation budget), as TRL's max_completion_length."
    )
    min_group_std: float = Field(1e-6, ge=0, description="Groups whose reward std is at or below this are skipped.")
    max_staleness: int = Field(
        0,
        ge=0,
        description=(
            "How many steps before the current one a stored turn may have been sampled. Older turns are refused by "
            "name: their importance ratio would be 1, training an old policy's samples as if they were this one's. "
            "0 is on-policy; raise it for asynchronous rollouts, ideally with `tis_cap`."
        ),
    )
    tis_cap: float | None = Field(
        None,
        gt=0,
        description=(
            "Truncated importance sampling: weigh each stored token's loss by min(exp(logp_old - logp_sampler), "
            "tis_cap), correcting for a sampler that is not the trained policy (another engine such as vLLM, a "
            "stale adapter). None (off) when the sampler is this server's own engine at the current step."
        ),
    )

    icepop: tuple[float, float] | None = Field(
        None,
        description=(
            "IcePop masking (Ring-1T): a token whose exp(logp_old - logp_sampler) lies outside [low, high] trains "
            "nothing (its loss is zeroed; the normalisers are unchanged), so tokens on which the sampler and the "
            "trainer disagree badly cannot steer the update. None: off unless `correct_serving_mismatch` turns it on."
        ),
    )
    correct_serving_mismatch: bool = Field(
        True,
        description=(
            "When the model samples at another precision than it trains (`ModelConfig.serving_dtype`), a step whose "
            "`tis_cap` or `icepop` is None uses 2.0 and (0.5, 5.0) (IcePop's band) for it; the result's config "
            "says what was used. Without a precision gap it changes nothing. False trains uncorrected."
        ),
    )

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @model_validator(mode="after")
    def _cispo_cap(self) -> TrainConfig:
        if self.loss == "cispo" and self.epsilon_high is None:
            raise ValueError(
                "loss='cispo' caps the importance ratio at epsilon_high; give it, e.g. epsilon_high=4.0 (ART) or 5.0"
            )
        return self

    @model_validator(mode="after")
    def _distilling(self) -> TrainConfig:
        if self.self_distill_only and not self.self_distill:
            raise ValueError("self_distill_only trains on the self-distillation term; give it a weight, self_distill=1.0")
        if isinstance(self.teacher, int) and self.teacher < 0:
            raise ValueError(f"teacher={self.teacher} is not a step; give a checkpoint number >= 0, 'self' or 'base'")
        return self

    def named_steps(self) -> set[int]:
        """The checkpoints this step reads besides the policy: the KL's reference and the teacher."""
        steps = {self.reference_step} if self.beta > 0 and self.reference_step is not None else set()
        if self.self_distill and isinstance(self.teacher, int):
            steps.add(self.teacher)
        return steps

    @model_validator(mode="after")
    def _icepop_band(self) -> TrainConfig:
        if self.icepop is not None and not 0 < self.icepop[0] <= 1 <= self.icepop[1]:
            raise ValueError(
                f"icepop={self.icepop} must be a band (low, high) with 0 < low <= 1 <= high, e.g. (0.5, 5.0)"
            )
        return self


class ModelConfig(Schema):
    """How the server loads and adapts a base model; fixed at registration."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["auto", "transformers", "vllm", "scripted"] = Field(
        "auto",
        description=(
            "`auto`: vLLM where CUDA is available and vLLM imports in the vLLM python (`art-agents doctor` says "
            "which), else transformers. `transformers` runs everywhere; `vllm` runs `vllm serve` as a process of "
            "its own (python from `--vllm-python` / ART_VLLM_PYTHON) and needs a GPU; `scripted` is for tests."
        ),
    )
    lora_rank: int = Field(16, ge=1, description="LoRA rank r (16 with TrainConfig's default learning rate).")
    lora_alpha: int = Field(32, ge=1, description="LoRA scaling alpha; the update is scaled by alpha / r.")
    lora_dropout: float = Field(
        0.0, ge=0, lt=1, description="Kept in the adapter config; GRPO training runs with dropout off (as TRL)."
    )
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], description="Modules that get LoRA adapters."
    )
    gguf_file: str | None = Field(None, description="GGUF file inside `base_model` (a folder), loaded by transformers.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="The precision the policy trains in. auto: bf16 on GPU, fp32 on CPU."
    )
    serving_dtype: Literal["auto", "float32", "bfloat16", "float16", "int8"] = Field(
        "auto",
        description=(
            "transformers engine: the precision of the base weights it samples from. auto: `dtype` (the engine and "
            "the trainer share one copy of the base). Another value keeps a second copy for the engine, converted "
            "once at register: `bfloat16` halves the bytes read per token, `int8` (CPU only: int8 weights of the "
            "linear layers, one scale per output channel, the rest bf16) nearly quarters them; the LoRA stays fp32 "
            "on top and the trainer keeps `dtype`. Steps then correct for the difference (see TrainConfig's "
            "`correct_serving_mismatch`). A precision this machine cannot run is refused at register."
        ),
    )
    device: str = Field("auto", description="auto: cuda when available, else cpu.")
    max_batch_size: int = Field(
        16, ge=1, description="Rows (choices of concurrent requests) the engine decodes together; more wait to join."
    )
    admission_window_ms: float = Field(
        5.0,
        ge=0,
        le=1000,
        description="How long an idle engine waits after a request for others sent with it (a group's rollouts), "
        "so their prompts are prefilled together and identical ones once. Requests arriving later join the "
        "running batch at its next token.",
    )
    prefix_cache_mb: float = Field(
        1024.0,
        ge=0,
        description=(
            "transformers engine: memory for the KV state of recently computed prompts and completions, so a prompt "
            "that starts like one of them (a group's shared head, a conversation's earlier turns) prefills only the "
            "rest; least recently used blocks are evicted first, and all of it is dropped when the adapter changes. "
            "1 GiB holds about 23k tokens of SmolLM2-135M in fp32 or 18k of Qwen2.5-7B in bf16; 0 turns it off. "
            "The vLLM engine uses vLLM's own prefix caching (on unless this is 0)."
        ),
    )
    max_queued_requests: int = Field(
        256, ge=1, description="Requests waiting for the engine; more are answered 503 with Retry-After."
    )
    default_max_tokens: int = Field(256, ge=1, description="max_tokens when a request gives none.")
    seed: int = Field(0, description="Seed for LoRA initialisation.")
    gpu_memory_utilization: float = Field(
        0.5,
        gt=0,
        le=1,
        description=(
            "vLLM: the share of the GPU's memory vLLM takes (weights and KV cache). The rest is the trainer's (the "
            "PEFT model, optimizer state, activations), as in TRL's colocate mode (whose default is 0.3). Raise it "
            "for longer contexts or more concurrent rollouts; lower it when training runs out of memory."
        ),
    )
    replicas: int = Field(
        1,
        ge=1,
        description=(
            "Transformers engines serving this model side by side behind a router that keeps a rollout's calls on "
            "one of them (its prefix cache) and publishes each checkpoint to all at once (devices with room for "
            "several copies; on vLLM use data_parallel_size)."
        ),
    )
    tensor_parallel_size: int = Field(
        1, ge=1, description="vLLM: GPUs one copy of the model is split over (`vllm serve --tensor-parallel-size`)."
    )
    data_parallel_size: int = Field(
        1,
        ge=1,
        description=(
            "vLLM: copies of the model serving requests side by side (`vllm serve --data-parallel-size`); vLLM "
            "uses tensor_parallel_size x data_parallel_size GPUs."
        ),
    )
    trainer_processes: int = Field(
        0,
        ge=0,
        description=(
            "0: the server's own process trains the policy (beside a transformers engine on its device, over the "
            "same base weights). N >= 1: N processes started by the server train it together with torch.distributed "
            "(`trainer_sharding`), one per `trainer_devices` entry, each holding its own copy of the base model; "
            "one that dies fails its step (the last checkpoint keeps serving) and all are restarted for the next."
        ),
    )
    trainer_sharding: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description=(
            "With trainer_processes >= 1: `ddp` keeps the whole model in every process and averages gradients; "
            "`fsdp` (FSDP2) shards parameters, gradients and optimizer state over the processes, decoder layer by "
            "decoder layer, for a model whose training state does not fit one device. Both give the update of "
            "one process on the same groups."
        ),
    )
    trainer_devices: list[str] = Field(
        default_factory=list,
        description=(
            "One device per trainer process (`cuda:1`, `cpu`); empty: cuda:0 .. cuda:N-1 where CUDA is available, "
            "else cpu. Processes talk over nccl on CUDA, gloo on CPU."
        ),
    )
    trainer_nodes: int = Field(
        1,
        ge=1,
        description=(
            "Machines training together, each with `trainer_processes` processes (torchrun's --nnodes): the "
            "server's node is node 0; each other node runs `art-agents trainer-node --rendezvous "
            "trainer_rendezvous --node-rank K`. `art_path` must be a filesystem every node sees at the same path."
        ),
    )
    trainer_rendezvous: str | None = Field(
        None,
        description=(
            "With trainer_nodes > 1: HOST:PORT where the server hosts torch.distributed's store for the nodes to "
            "meet (HOST: the server node's address as the other nodes reach it; PORT: open between the nodes). "
            "None: the server's ART_TRAINER_RENDEZVOUS (a launcher that knows the node's address sets it)."
        ),
    )
    trainer_timeout_s: float = Field(
        600.0,
        gt=0,
        description=(
            "Trainer processes: how long forming the group waits for every node, and how long a collective waits "
            "for a rank before the step fails (torch.distributed's timeout)."
        ),
    )
    vllm_server_url: str | None = Field(
        None,
        description=(
            "vLLM: serve from a vLLM server started elsewhere (ART's external runtime) instead of starting one. It "
            "must run `vllm serve` with the flags this server gives its own (--enable-lora, --max-lora-rank, "
            "--logprobs-mode processed_logprobs, ...: the error when it cannot be reached names them all) and "
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, and see the checkpoint folders at the same paths. Its API key, "
            "if any, comes from VLLM_API_KEY. It is never put to sleep unless vllm_sleep_mode is True."
        ),
    )
    vllm_nodes: list[str] = Field(
        default_factory=list,
        description=(
            "vLLM on several nodes: the URLs of the other nodes' vLLM servers, each started elsewhere as "
            "vllm_server_url is (same flags, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, the checkpoints on a shared "
            "filesystem at the same paths). The server spreads rollouts over its own vLLM and these, a rollout's "
            "calls on one of them, and loads each checkpoint into every one while all are paused, so none serves "
            "a step another has not loaded; one that refuses it fails the step by its URL."
        ),
    )
    vllm_startup_timeout: float = Field(
        600.0,
        gt=0,
        description=(
            "vLLM: seconds to wait for `vllm serve` to answer /health (loading weights, compiling, capturing CUDA "
            "graphs) before giving up with its log; also how long a request waits for a restart."
        ),
    )
    vllm_sleep_mode: bool | None = Field(
        None,
        description=(
            "vLLM: put vLLM to sleep (level 1: weights to CPU memory, KV cache freed) while training, so the "
            "trainer gets the GPU memory; starts vLLM with --enable-sleep-mode. None: on when the trainer runs on "
            "CUDA (`device`), sharing vLLM's GPU."
        ),
    )
    scripted_responses: list[str] | None = Field(
        None, description="Texts the `scripted` engine answers in order (tests only)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if self.engine == "scripted" and self.scripted_responses is None:
            raise ValueError("engine 'scripted' needs scripted_responses")
        if self.vllm_server_url and self.engine not in ("auto", "vllm"):
            raise ValueError(f"vllm_server_url is served by the vllm engine, not engine={self.engine!r}")
        if self.vllm_nodes and self.engine not in ("auto", "vllm"):
            raise ValueError(f"vllm_nodes are served by the vllm engine, not engine={self.engine!r}")
        if self.trainer_devices and len(self.trainer_devices) != self.trainer_processes:
            raise ValueError(
                f"trainer_devices names {len(self.trainer_devices)} devices for trainer_processes="
                f"{self.trainer_processes}; give one device per process, or leave trainer_devices empty"
            )
        if self.trainer_nodes > 1 and not self.trainer_processes:
            raise ValueError(
                f"trainer_nodes={self.trainer_nodes} needs trainer_processes >= 1: the processes on every node"
            )
        return self
