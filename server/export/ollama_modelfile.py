"""An Ollama Modelfile whose TEMPLATE renders chat messages as the model's own chat template does.

Ollama templates are Go templates, not Jinja, so the chat template is not copied but measured: rendered on
marker messages, it gives each role's text before and after the content, a default system message (SmolLM2
adds one when none is given) and the generation prompt. That shape (`RoleWrappers`) is then checked against
the chat template on several conversations; a template it does not reproduce (one that moves text between
turns) gets no TEMPLATE line, and the Modelfile says why. Tools are not rendered: Ollama's tool format is
its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant")
MARK = "\x00MARK\x00"
# Conversations the measured shape must render exactly as the chat template does (each ends with a user turn,
# as a request does).
CHECKS: tuple[tuple[tuple[str, str], ...], ...] = (
    (("user", "Hello there."),),
    (("system", "You are terse."), ("user", "What is 2+2?")),
    (("user", "Hi."), ("assistant", "Hello! How can I help?"), ("user", "Tell me a joke.")),
    (("system", "Be brief."), ("user", "One."), ("assistant", "Two."), ("user", "Three.")),
)


class TemplateShapeError(ValueError):
    """The chat template is not role-wrapped text that a Go template can reproduce."""


@dataclass(frozen=True)
class RoleWrappers:
    """A chat template measured as: each message is `before[role] + content + after[role]`, then the
    generation prompt; `default_system` is the system message it renders when a conversation has none."""

    before: dict[str, str]
    after: dict[str, str]
    generation_prompt: str
    default_system: str | None

    def render(self, messages: list[dict[str, str]]) -> str:
        """What this shape renders for `messages` (with the generation prompt), as Ollama would."""
        if self.default_system is not None and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": self.default_system}, *messages]
        body = "".join(self.before[m["role"]] + m["content"] + self.after[m["role"]] for m in messages)
        return body + self.generation_prompt

    def go_template(self) -> str:
        """The same shape as an Ollama (Go) TEMPLATE over `.Messages`; no `{{-` trimming, so newlines stay."""
        branches = "".join(
            f'{{{{ {"if" if i == 0 else "else if"} eq .Role "{role}" }}}}'
            f"{_go_text(self.before[role])}{{{{ .Content }}}}{_go_text(self.after[role])}"
            for i, role in enumerate(ROLES)
        )
        return f"{{{{ range .Messages }}}}{branches}{{{{ end }}}}{{{{ end }}}}{_go_text(self.generation_prompt)}"


def measure(tokenizer: Any) -> RoleWrappers:
    """The chat template's `RoleWrappers`, checked on `CHECKS`; `TemplateShapeError` if it does not fit."""

    def render(messages: list[tuple[str, str]], generation: bool = False) -> str:
        chat = [{"role": role, "content": content} for role, content in messages]
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation)

    system_before, system_after = _split(render([("system", MARK)]))
    head = render([("system", "S")])
    user_before, user_after = _split(render([("system", "S"), ("user", MARK)]).removeprefix(head))
    with_user = render([("system", "S"), ("user", "U")])
    reply = render([("system", "S"), ("user", "U"), ("assistant", MARK), ("user", "V")])
    assistant_before, assistant_after = _split(
        reply.removeprefix(with_user).removesuffix(user_before + "V" + user_after)
    )
    generation_prompt = render([("system", "S"), ("user", "U")], generation=True).removeprefix(with_user)
    lone_user = render([("user", MARK)])
    default = lone_user[: lone_user.index(MARK)].removesuffix(user_before)
    default_system = None
    if default:
        if not (default.startswith(system_before) and default.endswith(system_after)):
            raise TemplateShapeError(f"it renders {default!r} before a conversation without a system message")
        default_system = default[len(system_before) : len(default) - len(system_after)]
    shape = RoleWrappers(
        before={"system": system_before, "user": user_before, "assistant": assistant_before},
        after={"system": system_after, "user": user_after, "assistant": assistant_after},
        generation_prompt=generation_prompt,
        default_system=default_system,
    )
    for check in CHECKS:
        expected = render(list(check), generation=True)
        if shape.render([{"role": r, "content": c} for r, c in check]) != expected:
            raise TemplateShapeError(f"its rendering of {[r for r, _ in check]} is not role-wrapped text")
    return shape


def modelfile(gguf_name: str, tokenizer: Any) -> str:
    """The Modelfile for `ollama create NAME -f Modelfile` beside the GGUF file `gguf_name`."""
    from jinja2 import TemplateError

    lines = [f"FROM ./{gguf_name}"]
    stops = {tokenizer.eos_token} if tokenizer.eos_token else set()
    try:
        shape = measure(tokenizer)
    except (ValueError, TemplateError) as exc:  # TemplateShapeError, or a template that refuses a marker message
        lines.append(f"# no TEMPLATE: the chat template could not be measured ({exc}); Ollama uses its default")
    else:
        lines.append(f'TEMPLATE """{shape.go_template()}"""')
        if shape.default_system is not None:
            lines.append(f'SYSTEM """{shape.default_system}"""')
        end_of_turn = shape.after["assistant"].strip()
        if end_of_turn in tokenizer.get_vocab():
            stops.add(end_of_turn)
    lines.extend(f"PARAMETER stop {_quoted(stop)}" for stop in sorted(stops))
    return "\n".join(lines) + "\n"


def _split(text: str) -> tuple[str, str]:
    if text.count(MARK) != 1:
        raise TemplateShapeError("it does not render a message's content exactly once")
    before, after = text.split(MARK)
    return before, after


def _go_text(text: str) -> str:
    """Literal text in a Go template (a `{{` would start an action; `\"\"\"` would end the Modelfile string)."""
    if '"""' in text:
        raise TemplateShapeError('its text holds """, which ends a Modelfile string')
    return text.replace("{{", '{{ "{{" }}')


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
