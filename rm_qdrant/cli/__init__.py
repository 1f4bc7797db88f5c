"""``rmq``: the command line, one thin function per command over the library."""

from __future__ import annotations

import logging
import warnings

import click
from PIL import Image

from rm_qdrant.cli.calibrate import calibrate_command
from rm_qdrant.cli.common import Group, RedactingFormatter
from rm_qdrant.cli.control import pause_command, resume_command
from rm_qdrant.cli.cutover import finalize_command, rollback_command
from rm_qdrant.cli.evaluate import eval_command
from rm_qdrant.cli.failures import failures_command
from rm_qdrant.cli.fit import fit_command
from rm_qdrant.cli.migrate import migrate
from rm_qdrant.cli.model import model
from rm_qdrant.cli.pairs import drop_pair_command, pairs_command, switch_encoder_command
from rm_qdrant.cli.plan import plan_command
from rm_qdrant.cli.probe import probe_command
from rm_qdrant.cli.search import search
from rm_qdrant.cli.serve import index, init
from rm_qdrant.cli.status import status
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
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="Log what happens (-v), and every batch's ids (-vv). Log lines are redacted; HTTP and AWS "
    "libraries (botocore, urllib3, httpx...) log warnings only, whatever -v says.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or progress lines; errors only.")
@click.pass_context
def cli(ctx: click.Context, qdrant: str, api_key: str | None, verbose: int, quiet: bool) -> None:
    """Online backfilling for Qdrant: serve the new embedding model while the gallery migrates."""
    _logging((logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)])
    # rm-qdrant refuses oversized images itself (--max-pixels), with the point's id and reason.
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    if api_key and qdrant.lower().startswith("http://"):
        # qdrant-client warns on every connection, with a source line: one line of ours instead.
        warnings.filterwarnings("ignore", message="Api key is used with an insecure connection")
        if not quiet:
            click.echo("Warning: --api-key is sent in clear over http://; use https://", err=True)
    ctx.obj = {"qdrant": qdrant, "api_key": api_key, "store": None, "quiet": quiet, "verbose": verbose}


#: Loggers that write request headers or whole URLs at DEBUG (botocore: the Authorization
#: header with the access key id, x-amz-security-token): never below WARNING in rmq.
CHATTY = ("botocore", "boto3", "s3transfer", "urllib3", "httpx", "httpcore", "hpack")


def _logging(level: int) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    for chatty in CHATTY:
        logging.getLogger(chatty).setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        if not isinstance(handler.formatter, RedactingFormatter):
            handler.setFormatter(RedactingFormatter(handler.formatter))


def _late_quiet(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    """``rmq COMMAND -q``: as ``rmq -q COMMAND`` (the root has run; its record is updated)."""
    if value:
        ctx.find_root().obj["quiet"] = True


def _late_verbose(ctx: click.Context, _: click.Parameter, value: int) -> None:
    """``rmq COMMAND -v``: as ``rmq -v COMMAND``; counts add up (``rmq -v migrate -v`` is -vv)."""
    if value:
        obj = ctx.find_root().obj
        obj["verbose"] += value
        level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(obj["verbose"], 2)]
        _logging(level)
        root = logging.getLogger()  # basicConfig leaves a configured level as it is: lower it here
        root.setLevel(min(level, root.level))


def _accept_flags_after(command: click.Command) -> None:
    """Give ``command`` (and, in a group, its commands) rmq's ``-q`` and ``-v``, unless it has its own
    (``rmq train``'s commands): a flag is taken after the subcommand as before it."""
    taken = {opt for param in command.params for opt in getattr(param, "opts", ())}
    if "-q" not in taken:
        command.params.append(
            click.Option(["-q", "--quiet"], is_flag=True, expose_value=False, callback=_late_quiet,
                         help="As 'rmq -q': no progress bars or progress lines.")
        )  # fmt: skip
    if "-v" not in taken:
        command.params.append(
            click.Option(["-v", "--verbose"], count=True, expose_value=False, callback=_late_verbose,
                         help="As 'rmq -v': log what happens (-vv: every batch's ids).")
        )  # fmt: skip
    if isinstance(command, click.Group) and not isinstance(command, TrainGroup):
        for sub in command.commands.values():
            _accept_flags_after(sub)


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
cli.add_command(plan_command)
cli.add_command(fit_command)
cli.add_command(calibrate_command)
cli.add_command(finalize_command)
cli.add_command(failures_command)
cli.add_command(rollback_command)
cli.add_command(model)
cli.add_command(pairs_command)
cli.add_command(drop_pair_command)
cli.add_command(switch_encoder_command)
cli.add_command(pause_command)
cli.add_command(resume_command)
for _command in cli.commands.values():
    if not isinstance(_command, TrainGroup):  # its commands have their own -q and -v
        _accept_flags_after(_command)


def main() -> None:
    """Entry point of the ``rmq`` script."""
    cli(prog_name="rmq")
