"""What an AutoRL step costs in judge and generator tokens, and in dollars at LiteLLM's prices.

No provider is reachable here, so this measures the prompts AutoRL actually sends: the RULER group
prompt, the pairwise prompt and the generator's input prompt are rendered by the pipeline's own
code for the default settings (groups of 4, 4 groups a step, 12 held-out inputs, a pool of 32)
with answers of a given length, and counted with `litellm.token_counter` (tokenizers bundled with
LiteLLM) for the judge model. Completion tokens are counted on answers of the shape the judges must
give (an explanation of ~25 words per trajectory). Dollars are LiteLLM's price map for that model.
A real run reports what the provider billed (LiteLLM's `response_cost`) in `steps.jsonl`.

    python benchmarks/autorl_cost.py [--model openai/gpt-4.1-mini] [--answer-tokens 150]
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm

from art_agents.autorl.curriculum import Curriculum, PoolInput
from art_agents.autorl.generation import ask_for
from art_agents.autorl.task_data import INPUTS_SYSTEM, SETUP_SYSTEM
from art_agents.ruler.pairwise import PAIRWISE_SYSTEM, render_pair
from art_agents.ruler.prompt import render_judge_messages, trajectory_ids

TASK = "Answer customers of a bike shop about opening hours, repairs and returns: politely, correctly, briefly."
SYSTEM = (
    "You answer questions from customers of a bike shop. Be polite and correct, and answer in at most three "
    "sentences. Opening hours: Tuesday to Saturday 9:00-18:00. Repairs take one to three days. Returns are "
    "accepted within 30 days with a receipt."
)
RUBRIC = (
    "- Correct facts (hours, repair times, return policy) matter most; a wrong fact is a serious error.\n"
    "- Polite and direct; at most three sentences.\n- Answers the question asked, without padding."
)
QUESTION = (
    "Hi, I bought a helmet from you three weeks ago and wore it once. Can I still return it if I lost the receipt?"
)
EXPLANATION = " ".join(["the answer states the return policy correctly and stays polite but adds one unneeded"] * 2)


WORDS = "Thanks for asking! Returns are accepted within thirty days with a receipt, so we can offer credit instead."


def answer_text(tokens: int, model: str, variant: int) -> str:
    """About `tokens` tokens; variants differ from their first word on, as sampled answers do."""
    words = WORDS.split(" ")
    text = [f"Hello ({variant}),"]
    while litellm.token_counter(model=model, text=" ".join(text)) < tokens:
        text.append(words[(len(text) + variant) % len(words)])
    return " ".join(text)


def count(model: str, messages: list[dict[str, str]]) -> int:
    return litellm.token_counter(model=model, messages=messages)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="openai/gpt-4.1-mini")
    parser.add_argument("--answer-tokens", type=int, default=150)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--eval-inputs", type=int, default=12)
    parser.add_argument("--inputs", type=int, default=32)
    args = parser.parse_args()
    model, size = args.model, args.group_size
    answers = [answer_text(args.answer_tokens, model, k) for k in range(size)]
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    group = [[*conversation, {"role": "assistant", "content": a}] for a in answers]
    ids = trajectory_ids(size)
    judge_in = count(model, render_judge_messages(group, ids, RUBRIC))
    judge_out = litellm.token_counter(
        model=model,
        text=json.dumps({"scores": [{"trajectory_id": i, "explanation": EXPLANATION, "score": 0.7} for i in ids]}),
    )
    pair_in = count(model, [{"role": "system", "content": PAIRWISE_SYSTEM},
                            {"role": "user", "content": render_pair(QUESTION, answers[0], answers[1], RUBRIC, SYSTEM)}])  # fmt: skip
    pair_out = litellm.token_counter(model=model, text=json.dumps({"explanation": EXPLANATION, "better": "1"}))
    single_in = count(model, render_judge_messages(group[:1], ids[:1], RUBRIC))
    existing = [f"{QUESTION} (variant {n})" for n in range(args.inputs + args.eval_inputs)]
    pool = [PoolInput(id=f"i{n}", input=text, difficulty=2, last_score=0.3) for n, text in enumerate(existing[:5])]
    focus = Curriculum(pool, retire_after=2).focus()
    generator_in = count(model, [{"role": "system", "content": INPUTS_SYSTEM},
                                 {"role": "user", "content": f"The task:\n{TASK}\n\nWrite 1 inputs for it.\n\n{focus}"},
                                 {"role": "user", "content": ask_for(1, "inputs", existing)}])  # fmt: skip
    generator_out = litellm.token_counter(
        model=model, text=json.dumps({"inputs": [{"input": QUESTION, "difficulty": 3}]})
    )

    def inputs_request(count_: int, seen: list[str]) -> tuple[int, int]:
        asked = [{"role": "system", "content": INPUTS_SYSTEM},
                 {"role": "user", "content": f"The task:\n{TASK}\n\nWrite {count_} inputs for it."},
                 {"role": "user", "content": ask_for(count_, "inputs", seen)}]  # fmt: skip
        written = json.dumps({"inputs": [{"input": QUESTION, "difficulty": 3}] * count_})
        return count(model, asked), litellm.token_counter(model=model, text=written)

    setup_in = count(
        model, [{"role": "system", "content": SETUP_SYSTEM}, {"role": "user", "content": f"The task:\n{TASK}"}]
    )
    setup_out = litellm.token_counter(model=model, text=json.dumps({"system_prompt": SYSTEM, "rubric": RUBRIC}))
    held_out = inputs_request(args.eval_inputs, [])
    training = inputs_request(args.inputs, existing[: args.eval_inputs])
    start = (setup_in + held_out[0] + training[0], setup_out + held_out[1] + training[1])

    def dollars(prompt: int, completion: int) -> float:
        return sum(litellm.cost_per_token(model=model, prompt_tokens=prompt, completion_tokens=completion))

    step = (args.groups_per_step * judge_in, args.groups_per_step * judge_out)
    evaluation = (args.eval_inputs * (single_in + pair_in), args.eval_inputs * (judge_out // size + pair_out))
    rows = [
        (f"generator, once: prompt, rubric, {args.eval_inputs} + {args.inputs} inputs", *start),
        (f"judge, one training step ({args.groups_per_step} groups of {size})", *step),
        ("generator, one replacement input", generator_in, generator_out),
        (f"judge, one evaluation ({args.eval_inputs} inputs + win rate)", *evaluation),
    ]
    print(f"{model}, answers of {args.answer_tokens} tokens")
    print(f"{'':<48}{'prompt':>9}{'completion':>12}{'USD':>10}")
    for label, prompt, completion in rows:
        print(f"{label:<48}{prompt:>9}{completion:>12}{dollars(prompt, completion):>10.4f}")


if __name__ == "__main__":
    main()
