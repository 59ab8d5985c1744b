"""An agent in a process of its own: it knows only OPENAI_BASE_URL, OPENAI_API_KEY and ART_MODEL.

It asks for a tool call, runs the tool, sends the result back (streamed), and prints the final answer.
"""

import json
import os

from openai import OpenAI

client = OpenAI()  # reads OPENAI_BASE_URL and OPENAI_API_KEY, as any agent would
model = os.environ["ART_MODEL"]
tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
messages = [{"role": "user", "content": "What is 2 + 3?"}]
first = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=64)
call = first.choices[0].message.tool_calls[0]
arguments = json.loads(call.function.arguments)
messages += [first.choices[0].message.model_dump(exclude_none=True)]
messages += [{"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])}]
stream = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=64, stream=True)
answer = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
print(json.dumps({"answer": answer, "served_by": first.model}))
