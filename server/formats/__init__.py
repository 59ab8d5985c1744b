"""The protocols the server speaks, one module each, over one engine call.

Each module turns its request into the chat form the engine plans from (`ChatPlan`: messages, tools,
sampling) and the engine's chat result back into its own reply, stream of events and error shape. Gating,
`name@step` naming, the token store, the rollout log and the prefix cache sit below and are shared.
A new protocol is one module here and one router in `server/http/`.
"""
