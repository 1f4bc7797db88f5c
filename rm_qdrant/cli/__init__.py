"""``rmq``: the command line, one thin function per command over the library."""

from __future__ import annotations

import logging
import warnings

import click
from PIL import Image

from rm_qdrant.cli.calibrate import calibrate_command
from rm_qdrant.cli.common import Group
from rm_qdrant.cli.evaluate import eval_command
from rm_qdrant.cli.fit import fit_command
from rm_qdrant.cli.migrate import finalize_command, migrate, rollback_command
from rm_qdrant.cli.model import model
from rm_qdrant.cli.pairs import drop_pair_command, pairs_command, switch_encoder_command
from rm_qdrant.cli.probe import probe_command
from rm_qdrant.cli.serve import index, init, search, status
from rm_qdrant.cli.training import TrainGroup, demo, export_command

__all__ = ["cli", "main"]


@click.group(cls=Group)
@click.option(
    "--qdrant",
    envvar="RMQ_QDRANT",
    default="./rmq-data",
    show_default=True,
    help="Embedded store folder, ':memory:', or a server URL (http(s)://host:6333).",
)
@click.option("--api-key", envvar="QDRANT_API_KEY", default=None, help="Qdrant server API key.")
@click.option("-v", "--verbose", count=True, help="Log what happens (-v), and every batch's ids (-vv).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or progress lines; errors only.")
@click.pass_context
def cli(ctx: click.Context, qdrant: str, api_key: str | None, verbose: int, quiet: bool) -> None:
    """Online backfilling for Qdrant: serve the new embedding model while the gallery migrates."""
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    for chatty in ("httpx", "httpcore"):  # they log whole URLs, credentials included
        logging.getLogger(chatty).setLevel(logging.WARNING)
    # rm-qdrant refuses oversized images itself (--max-pixels), with the point's id and reason.
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    ctx.obj = {"qdrant": qdrant, "api_key": api_key, "store": None, "quiet": quiet, "verbose": verbose}


cli.add_command(
    TrainGroup(name="train", help="Train backbones, heads, adapters and baselines (needs PyTorch).")
)
cli.add_command(init)
cli.add_command(index)
cli.add_command(search)
cli.add_command(status)
cli.add_command(export_command)
cli.add_command(demo)
cli.add_command(migrate)
cli.add_command(eval_command)
cli.add_command(probe_command)
cli.add_command(fit_command)
cli.add_command(calibrate_command)
cli.add_command(finalize_command)
cli.add_command(rollback_command)
cli.add_command(model)
cli.add_command(pairs_command)
cli.add_command(drop_pair_command)
cli.add_command(switch_encoder_command)


def main() -> None:
    """Entry point of the ``rmq`` script."""
    cli(prog_name="rmq")
