"""``rmq failures``: the points a migration could not move, with why and how often."""

from __future__ import annotations

import json
from pathlib import Path

import click

from rm_qdrant.api import inspecting
from rm_qdrant.cli.common import json_option, name_option, open_cli_store, public, safe_text
from rm_qdrant.errors import ConfigError
from rm_qdrant.operations.failures import as_json as failure_json
from rm_qdrant.operations.failures import failure_line, plural, write_failures


@click.command(name="failures")
@name_option
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    help="Write the list to this file as JSON lines (never overwrites a file).",
)
@json_option
@click.pass_context
def failures_command(ctx: click.Context, name: str, out: str | None, as_json: bool) -> None:
    """List the points whose migration failed: id, image (redacted), reason, attempts.

    They still serve from the old model. Fix their source and run 'rmq migrate --retry-failed',
    or cut over without them: 'rmq finalize --drop-failed'.
    """
    if out is not None and as_json:
        raise ConfigError("use --json (to stdout) or --out FILE (JSON lines), not both")
    found = inspecting.failures(open_cli_store(ctx), name)
    if out is not None:
        written = write_failures(Path(out), found)
        click.echo(safe_text(f"wrote {plural(written, 'failed point')} of pair {name!r} to {out}"))
        return
    if as_json:
        # Streamed: a page of points at a time, whatever the number of failures.
        click.echo(json.dumps({"pair": public(name)}, ensure_ascii=True)[:-1] + ', "points": [')
        count = 0
        for failure in found:
            separator = "," if count else ""
            click.echo(separator + json.dumps(public(failure_json(failure)), ensure_ascii=True))
            count += 1
        click.echo(f'], "failed": {count}}}')
        return
    count = 0
    for failure in found:
        click.echo(safe_text(failure_line(failure)))
        count += 1
    click.echo(safe_text(f"{plural(count, 'failed point')} in pair {name!r}"))
