"""The clients of the load benchmark (load.py): one call of each protocol the server speaks, streamed or not, each
through its own SDK (`openai` for Chat, Responses and Completions, `anthropic` for Messages), and what they saw.

A call returns its `Answer`: the id, the text and the `model` field (`name@step`), so the run can check that no
step whose train call returned is ever answered by an older one. Streams are read to their end, except the
deliberate disconnects, which close the connection after the first event and count apart.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

PROTOCOLS = ("chat", "responses", "messages", "completions")
REFUSED = (429, 503)  # deliberate back-pressure with retry-after: counted apart, not failures

HEADS = [
    " ".join(f"Rule {rule} of agent {agent}: answer briefly, use tool number {rule} when asked." for rule in range(12))
    for agent in range(4)
]


@dataclass(frozen=True)
class Answer:
    id: str
    text: str
    served_as: str  # the reply's `model` field: name@step

    @property
    def step(self) -> int:
        return int(self.served_as.rpartition("@")[2])


@dataclass
class Kind:
    """What the clients of one protocol, streamed or not, saw."""

    latencies: list[float] = field(default_factory=list)
    busy: int = 0
    failures: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        return {
            "served": len(ordered),
            "failed": len(self.failures),
            "busy_refused": self.busy,
            "p50_s": round(statistics.median(ordered), 3) if ordered else None,
            "p99_s": round(ordered[int(0.99 * (len(ordered) - 1))], 3) if ordered else None,
        }


@dataclass
class Tally:
    """Every kind's figures, the steps committed so far, and what the answers said of them."""

    kinds: dict[str, Kind] = field(default_factory=dict)
    committed: list[int] = field(default_factory=list)  # steps whose train call returned, in order
    served_steps: set[int] = field(default_factory=set)
    stale: list[str] = field(default_factory=list)  # answers older than a step committed before they were asked
    recent: list[tuple[str, str]] = field(default_factory=list)  # (chat completion id, text): what training uses
    disconnects: int = 0

    def kind(self, name: str) -> Kind:
        return self.kinds.setdefault(name, Kind())

    def record(self, name: str, latency: float, answer: Answer, committed_before: int) -> None:
        self.kind(name).latencies.append(latency)
        self.served_steps.add(answer.step)
        if answer.step < committed_before:
            self.stale.append(f"{name}: {answer.served_as} after step {committed_before} committed")
        if name.startswith("chat"):
            self.recent = [*self.recent[-63:], (answer.id, answer.text)]

    def latest(self) -> int:
        return self.committed[-1] if self.committed else 0


class Calls:
    """One SDK client per API, and one call of each protocol, streamed or not."""

    def __init__(self, base_url: str, name: str, max_tokens: int) -> None:
        import anthropic
        import openai

        self.openai = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        self.anthropic = anthropic.AsyncAnthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
        self.name, self.max_tokens = name, max_tokens

    async def close(self) -> None:
        await self.openai.close()
        await self.anthropic.close()

    def open(self, protocol: str, stream: bool, system: str, question: str, max_tokens: int | None = None) -> Any:
        """The SDK call of `protocol`: its reply, or (streamed) its stream of events."""
        tokens = max_tokens or self.max_tokens
        user = [{"role": "user", "content": question}]
        if protocol == "chat":
            messages = [{"role": "system", "content": system}, *user]
            return self.openai.chat.completions.create(  # type: ignore[call-overload]
                model=self.name, messages=messages, max_tokens=tokens, stream=stream
            )
        if protocol == "responses":
            return self.openai.responses.create(  # type: ignore[call-overload]
                model=self.name, instructions=system, input=question, max_output_tokens=tokens, stream=stream
            )
        if protocol == "messages":
            return self.anthropic.messages.create(  # type: ignore[call-overload]
                model=self.name, system=system, messages=user, max_tokens=tokens, stream=stream
            )
        return self.openai.completions.create(  # type: ignore[call-overload]
            model=self.name, prompt=f"{system}\n{question}", max_tokens=tokens, stream=stream
        )

    async def answer(self, protocol: str, stream: bool, system: str, question: str) -> Answer:
        reply = await self.open(protocol, stream, system, question)
        if stream:
            return await read_stream(protocol, reply)
        if protocol == "chat":
            return Answer(reply.id, reply.choices[0].message.content or "", reply.model)
        if protocol == "responses":
            return Answer(reply.id, reply.output_text, reply.model)
        if protocol == "messages":
            return Answer(reply.id, "".join(getattr(block, "text", "") for block in reply.content), reply.model)
        return Answer(reply.id, reply.choices[0].text, reply.model)


async def read_stream(protocol: str, events: Any) -> Answer:
    """Read a stream to its end: its id, text and `model` field (from its first event that carries them)."""
    ident, text, served_as = "", "", ""
    async for event in events:
        if protocol in ("chat", "completions"):
            ident, served_as = event.id, event.model
            if protocol == "chat":
                text += "".join(choice.delta.content or "" for choice in event.choices)
            else:
                text += "".join(choice.text for choice in event.choices)
        elif protocol == "responses" and event.type in ("response.created", "response.completed"):
            ident, served_as = event.response.id, event.response.model
        elif protocol == "responses" and event.type == "response.output_text.delta":
            text += event.delta
        elif protocol == "messages" and event.type == "message_start":
            ident, served_as = event.message.id, event.message.model
        elif protocol == "messages" and event.type == "content_block_delta" and event.delta.type == "text_delta":
            text += event.delta.text
    if not served_as:
        raise RuntimeError(f"a {protocol} stream ended without naming its model")
    return Answer(ident, text, served_as)


def question_of(index: int, generator: random.Random) -> tuple[str, str]:
    """An agent-shaped request: one of four long shared heads (the prefix cache serves them) and a question of its
    own (new blocks that fill the cache until it evicts)."""
    question = " ".join(str(generator.randrange(10**6)) for _ in range(8))
    return HEADS[index % len(HEADS)], f"client {index} asks question {question}"


async def client_loop(index: int, calls: Calls, kind: tuple[str, bool], stop_at: float, tally: Tally) -> None:
    """Ask without pause until `stop_at`; a refusal waits its retry-after, anything else is a failure."""
    import anthropic
    import openai

    protocol, stream = kind
    name = f"{protocol}{' stream' if stream else ''}"
    generator = random.Random(index)
    while time.monotonic() < stop_at:
        system, question = question_of(index, generator)
        committed_before = tally.latest()
        started = time.perf_counter()
        try:
            answer = await calls.answer(protocol, stream, system, question)
            tally.record(name, time.perf_counter() - started, answer, committed_before)
        except (openai.APIStatusError, anthropic.APIStatusError) as exc:
            if exc.status_code in REFUSED:
                tally.kind(name).busy += 1
                await asyncio.sleep(float(exc.response.headers.get("retry-after", "1")))
            else:
                tally.kind(name).failures.append(f"{exc.status_code}: {exc.message[:120]}")
        except Exception as exc:  # a broken connection, a timeout, a stream cut short: a failure to report
            tally.kind(name).failures.append(f"{type(exc).__name__}: {exc}"[:160])


async def disconnect_loop(calls: Calls, every_s: float, stop_at: float, tally: Tally) -> None:
    """`every_s` after the last, a streamed call of the next protocol whose client hangs up after its first event,
    as a user's Ctrl-C or a crashed agent does mid-stream (the request itself must have been answered)."""
    generator, turn = random.Random(-1), 0
    while time.monotonic() + every_s < stop_at:
        await asyncio.sleep(every_s)
        protocol = PROTOCOLS[turn % len(PROTOCOLS)]
        turn += 1
        system, question = question_of(turn, generator)
        try:
            events = await calls.open(protocol, True, system, question, max_tokens=4 * calls.max_tokens)
            async for _ in events:
                break
            await events.close()
            tally.disconnects += 1
        except Exception as exc:
            tally.kind(f"{protocol} disconnect").failures.append(f"{type(exc).__name__}: {exc}"[:160])
