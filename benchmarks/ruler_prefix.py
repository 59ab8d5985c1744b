"""Judge prompt tokens for one RULER call, with and without showing the shared prefix once.

A group of 8 rollouts of one task, 6 turns each (assistant tool call + tool result, the last turn
a final answer). Every rollout shares the system prompt, the tools and the task; they differ from
the first assistant turn on. Without dedup each trajectory is shown in full, tools included. Tokens are counted with `litellm.token_counter` (tiktoken encodings
bundled with LiteLLM, offline) on the exact messages the judge would receive.

    LITELLM_LOCAL_MODEL_COST_MAP=True python benchmarks/ruler_prefix.py
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

GROUP_SIZE = 8
TURNS = 6
COUNT_AS = "gpt-4o"  # the tokenizer used for counting; the ratio barely depends on it

SYSTEM = (
    "You are a support agent for an online bookshop. You can look up orders, search the catalogue and issue "
    "refunds using the tools provided. Always verify the customer's order before acting on it. Never refund more "
    "than the order total. Be concise and polite; summarise what you did at the end. If a request is outside "
    "policy, explain the policy and offer an alternative. Policies: refunds within 30 days of delivery for any "
    "reason; damaged items are refunded or replaced at the customer's choice; digital books are refundable only "
    "if not downloaded; shipping costs are refunded only when the shop made the mistake. Escalate to a human when "
    "the customer asks for one, when fraud is suspected, or when a refund exceeds 200 EUR."
)
TASK = (
    "Hi, I ordered three books last week (order 48213): 'The Left Hand of Darkness', 'Piranesi' and a hardcover "
    "'Middlemarch'. Piranesi arrived with a torn cover and Middlemarch never arrived at all, although the tracking "
    "page says delivered. I'd like a refund for Middlemarch and a replacement for Piranesi, and I want to know "
    "whether you'll refund the shipping because this is the second time this has happened. Thanks, Dana."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": doc,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string"} for arg in args},
                "required": list(args),
            },
        },
    }
    for name, doc, args in [
        ("lookup_order", "Order details: items, prices, delivery status and dates.", ("order_id",)),
        ("search_catalogue", "Search books by title or author; returns stock and prices.", ("query",)),
        ("issue_refund", "Refund an amount for an order item; returns a refund id.", ("order_id", "item", "amount")),
        ("create_replacement", "Ship a replacement for an order item.", ("order_id", "item")),
        ("escalate", "Hand the conversation to a human agent with a note.", ("note",)),
    ]
]

THOUGHTS = [
    "First I should check the order details to confirm the items and delivery status.",
    "The order shows all three items as delivered; I need to check the item prices before refunding.",
    "Piranesi was damaged, so the customer may choose a replacement; I will check stock.",
    "Middlemarch is marked delivered but the customer says it never arrived; policy allows a refund.",
    "The customer mentions a repeated problem; I should consider whether shipping is refundable.",
    "Before refunding I want to make sure the amount does not exceed the order total.",
    "The tracking page may be wrong; I could escalate if fraud were suspected, but nothing suggests it.",
]
RESULTS = [
    {
        "order_id": "48213",
        "status": "delivered",
        "delivered_at": "2026-11-25",
        "items": [
            {"title": "The Left Hand of Darkness", "price": 11.99},
            {"title": "Piranesi", "price": 14.5},
            {"title": "Middlemarch (hardcover)", "price": 32.0},
        ],
        "shipping": 4.95,
        "total": 63.44,
    },
    {"results": [{"title": "Piranesi", "author": "Susanna Clarke", "in_stock": 14, "price": 14.5}]},
    {"refund_id": "rf-77120", "status": "issued"},
    {"replacement_id": "rp-5531", "eta": "2026-12-05"},
    {"ticket": "esc-2231", "status": "queued", "note": "customer reports repeated delivery problems"},
]
FINALS = [
    "I have refunded Middlemarch (32.00 EUR) and arranged a replacement copy of Piranesi, arriving around 5 "
    "December. Because the shop's carrier marked an undelivered parcel as delivered, I also refunded the shipping.",
    "Middlemarch has been refunded and a new Piranesi is on its way. Shipping is refunded only when we made the "
    "mistake; I have passed your note about repeated problems to a colleague who will follow up.",
    "Sorry about this. I refunded 32.00 EUR for Middlemarch. I could not arrange the replacement yet; a colleague "
    "will contact you about Piranesi and the shipping costs.",
]


def rollout(seed: int) -> list[dict[str, Any]]:
    """One plausible 6-turn rollout: 5 tool-using turns, then a final answer."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for turn in range(TURNS - 1):
        tool = rng.choice(TOOLS)["function"]
        arguments = {
            arg: rng.choice(["48213", "Piranesi", "Middlemarch (hardcover)", "32.0"])
            for arg in tool["parameters"]["properties"]
        }
        call_id = f"call_{seed}_{turn}"
        messages.append(
            {
                "role": "assistant",
                "content": " ".join(rng.sample(THOUGHTS, 2)),
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": tool["name"], "arguments": json.dumps(arguments)},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(rng.choice(RESULTS))})
    messages.append({"role": "assistant", "content": rng.choice(FINALS)})
    return messages


def main() -> None:
    import litellm

    from art_agents.ruler.prompt import DEFAULT_RUBRIC, render_judge_messages, trajectory_ids

    group = [rollout(seed) for seed in range(GROUP_SIZE)]
    ids = trajectory_ids(GROUP_SIZE)

    def tokens(dedup: bool, with_tools: bool = True) -> int:
        messages = render_judge_messages(
            group, ids, DEFAULT_RUBRIC, tools=[TOOLS] * GROUP_SIZE if with_tools else None, dedup_prefix=dedup
        )
        return litellm.token_counter(model=COUNT_AS, messages=messages)

    full, dedup = tokens(False), tokens(True)
    messages_full, messages_dedup = tokens(False, with_tools=False), tokens(True, with_tools=False)
    prefix = litellm.token_counter(model=COUNT_AS, messages=group[0][:2])
    print(
        f"group: {GROUP_SIZE} trajectories x {TURNS} turns ({len(group[0])} messages each); shared: system + task "
        f"(~{prefix} tokens) and {len(TOOLS)} tools; counted with {COUNT_AS}'s tokenizer"
    )
    print(f"judge prompt tokens without prefix dedup: {full}")
    print(f"judge prompt tokens with prefix dedup:    {dedup}")
    print(f"ratio without/with: {full / dedup:.2f}x (dedup sends {dedup / full:.0%} of the baseline)")
    print(
        f"messages only, no tools in either: {messages_full} vs {messages_dedup}, {messages_full / messages_dedup:.2f}x"
    )


if __name__ == "__main__":
    main()
