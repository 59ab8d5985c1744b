"""`art-agents trainer-node`: run on every node but the server's when a model trains with `trainer_nodes` > 1."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from art_agents.extras import require_extra


def trainer_node(
    rendezvous: Annotated[
        str,
        typer.Option(
            help="HOST:PORT of the server's store: the model's trainer_rendezvous (torchrun's --rdzv-endpoint).",
            show_default=False,
        ),
    ],
    node_rank: Annotated[
        int,
        typer.Option(help="This node's number, 1 .. trainer_nodes - 1 (the server's node is 0).", show_default=False),
    ],
    wait_s: Annotated[
        float | None,
        typer.Option(
            help="Exit (code 1) when the server's store has not answered for this many seconds, at the start or "
            "after losing it. Default: wait until stopped.",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Start this node's trainer ranks for every step the server asks of them; runs until stopped (Ctrl-C)."""
    require_extra("server", purpose="art-agents trainer-node", load=False)
    from art_agents.server.training.trainer_node import StoreUnreachable, check_arguments, run_trainer_node

    try:
        check_arguments(rendezvous, node_rank, wait_s)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        run_trainer_node(rendezvous, node_rank, wait_s)
    except StoreUnreachable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    except KeyboardInterrupt:
        typer.echo(f"node {node_rank}: stopped")
