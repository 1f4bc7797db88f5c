"""What every ``rmq`` command shares: error handling, the store, output."""

from __future__ import annotations

import json
from typing import Any

import click

from rm_qdrant.errors import RmqError
from rm_qdrant.store import Store, open_store

name_option = click.option("--name", required=True, help="The pair's name.")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


class Group(click.Group):
    """Turns library errors into one line on stderr and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RmqError as exc:
            raise click.ClickException(str(exc)) from exc


def open_cli_store(ctx: click.Context) -> Store:
    obj = ctx.find_root().obj
    if obj.get("store") is None:
        obj["store"] = open_store(obj["qdrant"], api_key=obj["api_key"])
        ctx.find_root().call_on_close(obj["store"].close)
    return obj["store"]


def emit(data: Any, as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if as_json else text)
