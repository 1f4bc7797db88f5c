"""``rmq pause`` and ``rmq resume``: hold a pair's running migrations between batches, and let
them go on (see :mod:`rm_qdrant.pair.control`)."""

from __future__ import annotations

import dataclasses

import click

from rm_qdrant.cli.common import emit, json_option, open_cli_store, pair_name, plain
from rm_qdrant.pair.control import pause, resume


@click.command(name="pause")
@pair_name
@json_option
@click.pass_context
def pause_command(ctx: click.Context, name: str, as_json: bool) -> None:
    """Hold every migration of pair NAME before its next batch, in every process, until rmq resume.

    Batches already claimed finish and settle; a migration started meanwhile waits before its
    first batch. On the embedded store only the process that holds it can be reached: pause from
    another terminal needs a Qdrant server (there, stop a migration with Ctrl-C and run it again).
    """
    done = pause(open_cli_store(ctx), name)
    text = (
        f"paused {plain(name)}: running migrations stop claiming batches; "
        f"'rmq resume {plain(name)}' lets them go on"
        if done.changed
        else f"{plain(name)} was already paused: nothing changed"
    )
    emit(dataclasses.asdict(done), as_json, text)


@click.command(name="resume")
@pair_name
@json_option
@click.pass_context
def resume_command(ctx: click.Context, name: str, as_json: bool) -> None:
    """Let the migrations of pair NAME that rmq pause holds go on."""
    done = resume(open_cli_store(ctx), name)
    text = (
        f"resumed {plain(name)}: waiting migrations go on within a second"
        if done.changed
        else f"{plain(name)} was not paused: nothing changed"
    )
    emit(dataclasses.asdict(done), as_json, text)
