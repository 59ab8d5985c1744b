"""Which pip extra installs what, checked where a command or entry point starts, before it starts anything.

Without the check a missing extra surfaces late and somewhere else: an `import mcp` failing inside a
background task left MCP•RL waiting 30 s and then blamed the MCP server.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Iterator, Sequence

from art_agents.errors import MissingExtra

# The extra that installs each top-level module a command may import lazily.
EXTRA_OF_MODULE = {
    **dict.fromkeys(
        ("torch", "transformers", "peft", "trl", "accelerate", "fastapi", "uvicorn", "tokenizers", "jinja2"), "server"
    ),
    **dict.fromkeys(("langgraph", "langchain", "langchain_core", "langchain_openai"), "langgraph"),
    "litellm": "ruler",
    "mcp": "mcp",
    "langfuse": "langfuse",
    "wandb": "wandb",
    "matplotlib": "report",
    "vllm": "vllm",
    "gguf": "server",
}
# What `require_extra` checks by default: modules only that extra installs.
PROBES = {
    "server": ("torch", "transformers", "peft", "trl", "fastapi", "uvicorn"),
    "mcp": ("mcp",),
    "ruler": ("litellm",),
    "langgraph": ("langgraph", "langchain_core", "langchain_openai"),
    "report": ("matplotlib",),
}


def install_hint(extra: str) -> str:
    return f"pip install 'art-agents[{extra}]' (from a clone: pip install -c constraints.txt -e '.[{extra}]')"


def missing_extra(purpose: str, extra: str, cause: ImportError) -> MissingExtra:
    return MissingExtra(f"{purpose} needs the '{extra}' extra ({cause}): {install_hint(extra)}")


def require_extra(extra: str, *, purpose: str, modules: Sequence[str] | None = None, load: bool = True) -> None:
    """Raise MissingExtra unless `modules` (default: the extra's PROBES) import; `load=False` only looks
    them up, for modules another process or a later step imports (`import litellm` or `torch` takes seconds)."""
    for name in PROBES[extra] if modules is None else modules:
        try:
            if load:
                importlib.import_module(name)
            elif importlib.util.find_spec(name) is None:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        except ImportError as exc:
            raise missing_extra(purpose, extra, exc) from exc


def exit_unless_installed(purpose: str, *extras: str) -> None:
    """For a script's first lines (the examples), before it imports any extra: a missing one ends it at once
    with the commands' one line, `error: <MissingExtra>` and exit status 1, not with a traceback when first used."""
    try:
        for extra in extras:
            require_extra(extra, purpose=purpose, load=False)
    except MissingExtra as exc:
        raise SystemExit(f"error: {exc}") from None


def extra_of(exc: ModuleNotFoundError) -> str | None:
    """The extra that installs the module `exc` is about, or None if none does."""
    return EXTRA_OF_MODULE.get((exc.name or "").split(".")[0])


@contextlib.contextmanager
def extra_imports(extra: str, *, purpose: str) -> Iterator[None]:
    """Around a module's own imports of an extra's packages: one missing raises MissingExtra naming the extra."""
    try:
        yield
    except ModuleNotFoundError as exc:
        raise missing_extra(purpose, extra, exc) from exc
