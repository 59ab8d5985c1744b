"""One served model: its folder, engine, trained policy, token store and training lock, and how it is opened."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from art_agents.atomic import write_text_atomic
from art_agents.names import check_safe_name
from art_agents.server.engines.protocol import Engine
from art_agents.server.engines.registry import load_engine
from art_agents.server.errors import ServiceError
from art_agents.server.models.model_sources import ModelSources
from art_agents.server.storage import checkpoints
from art_agents.server.storage.folder_lock import FolderInUse, FolderLock, lock_folder
from art_agents.server.storage.token_store import TokenStore
from art_agents.server.training.policy_model import PolicyModel
from art_agents.server.training.step_work import StepTrainer
from art_agents.server.training.trainer_processes import ProcessTrainer, TrainerProcesses, TrainerProcessFailed
from art_agents.wire import ModelInfo, RegisterRequest

log = logging.getLogger("art_agents.server")


@dataclass
class ServedModel:
    info: ModelInfo
    model_dir: Path
    engine: Engine
    policy: PolicyModel  # what training trains; its adapter holds the served step's weights between steps
    store: TokenStore
    owner: FolderLock  # this process owns model_dir until close()
    trainer_processes: TrainerProcesses | None = None  # with ModelConfig.trainer_processes; None: this process trains
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # serialises training and checkpoint deletion

    @property
    def step(self) -> int:
        return self.engine.step

    @property
    def served_as(self) -> str:
        """What a completion's `model` field answers: `name@step`."""
        return f"{self.info.name}@{self.step}"

    @property
    def context_tokens(self) -> int | None:
        return self.policy.context_tokens

    def trainer(self, optimizer_state: dict | None) -> StepTrainer:
        """What trains the policy for one call, starting from the optimizer state of the served step."""
        if self.trainer_processes is not None:
            return ProcessTrainer(self.trainer_processes, self.policy, optimizer_state)
        from art_agents.server.training.trainer import PolicyTrainer

        return PolicyTrainer(
            self.policy.model, self.policy.tokenizer, self.store, optimizer_state, kept_adapters=self.policy.kept
        )

    async def close(self) -> None:
        try:
            if self.trainer_processes is not None:
                await asyncio.to_thread(self.trainer_processes.close)
            await self.engine.close()
            self.store.close()
        finally:
            self.owner.release()


def check_name(value: str, what: str = "model name") -> str:
    """`check_safe_name`, refused as a 400 (a name becomes a folder name)."""
    try:
        return check_safe_name(value, what)
    except ValueError as exc:
        raise ServiceError(400, str(exc)) from exc


def open_served_model(model_dir: Path, request: RegisterRequest) -> ServedModel:
    """Own `model_dir`, load the engine and its latest checkpoint (creating step 0 for a new model).

    A folder another live server owns is a 409 naming that server (see folder_lock.py).
    """
    try:
        owner = lock_folder(model_dir)
    except FolderInUse as exc:
        raise ServiceError(409, str(exc)) from exc
    try:
        return _open(model_dir, request, owner)
    except BaseException:
        owner.release()
        with contextlib.suppress(OSError):
            model_dir.rmdir()  # only if the failed open left it empty
        raise


def _open(model_dir: Path, request: RegisterRequest, owner: FolderLock) -> ServedModel:
    meta = model_dir / "model.json"
    if meta.exists():  # the stored registration wins: config is fixed at registration
        request = RegisterRequest.model_validate_json(meta.read_text(encoding="utf-8"))
    if request.config.engine != "scripted":
        ModelSources.find(request.base_model, request.config.gguf_file)
    processes = _trainer_processes(model_dir, request)  # before the engine: a refused rendezvous leaves nothing
    try:
        engine = load_engine(request.base_model, request.config, request.name, model_dir)
        policy = PolicyModel.load(request.base_model, request.config, engine.tokenizer, engine.base_weights())
    except ServiceError:
        raise
    except Exception as exc:
        log.warning("loading base_model %r failed", request.base_model, exc_info=exc)
        raise ServiceError(400, ModelSources.load_error(request.base_model)) from exc
    step = checkpoints.latest_step(model_dir)
    if step is None:
        step = 0
        checkpoints.save_checkpoint(model_dir, 0, policy.model, None, {"initialised_with_seed": request.config.seed})
    else:
        policy.load_checkpoint(checkpoints.checkpoint_path(model_dir, step))
        engine.load_adapter(checkpoints.checkpoint_path(model_dir, step))
    engine.step = step
    write_text_atomic(meta, request.model_dump_json(indent=2))
    store = TokenStore(model_dir / "tokens" / "store.sqlite")
    info = ModelInfo(
        name=request.name, project=request.project, base_model=request.base_model, step=step, config=request.config
    )
    log.info("serving %s@%d from %s", request.name, step, model_dir)
    return ServedModel(
        info=info,
        model_dir=model_dir,
        engine=engine,
        policy=policy,
        store=store,
        owner=owner,
        trainer_processes=processes,
    )


def _trainer_processes(model_dir: Path, request: RegisterRequest) -> TrainerProcesses | None:
    """The model's trainer processes (with `trainer_processes`), whose store the other nodes can join from now on;
    an address the store cannot listen on is a 400 naming it."""
    if not request.config.trainer_processes:
        return None
    try:
        return TrainerProcesses(request.base_model, request.config, model_dir)
    except (ValueError, TrainerProcessFailed) as exc:
        raise ServiceError(400, str(exc)) from exc
