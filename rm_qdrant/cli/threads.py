"""``--threads``, the training's log lines, and what a command that needs PyTorch says without it:
shared by ``rmq fit`` and the training commands (train/cli.py), which import this module and not
the commands' (training.py, which loads train/cli.py: the two would import each other)."""

from __future__ import annotations

import logging
from typing import Any

import click

from rm_qdrant.api.common import needs_torch as library_needs_torch

# --threads chosen and applied as rm_qdrant.fit does, for the training commands too
from rm_qdrant.api.training import apply_threads, choose_threads  # noqa: F401


def needs_torch(exc: ModuleNotFoundError) -> click.ClickException:
    """The library's error for a missing training dependency, as a click error (raised where
    click resolves ``rmq train``'s commands); any other missing module is raised as it is."""
    return click.ClickException(str(library_needs_torch(exc)))


def show_progress(*, verbose: bool = False, quiet: bool = False) -> None:
    """Log the training's progress (epochs, caches, parity checks) unless asked to be quiet.

    ``rmq`` sets up logging at WARNING; training's own loggers are raised to INFO here, so
    a long step is never silent by default. Here, not in ``rm_qdrant_train``: ``rmq fit`` sets
    them before :func:`rm_qdrant.fit` imports the training code (and torch).
    """
    root = click.get_current_context().find_root().obj or {}
    level = logging.WARNING if quiet or root.get("quiet") else logging.DEBUG if verbose else logging.INFO
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
    for name in ("rm_qdrant_train", "rm_qdrant_exporters"):
        logging.getLogger(name).setLevel(level)


#: As train/threads.py: rm_qdrant loads rm_qdrant_train only when a command trains.
MAX_THREADS = 1024


class ThreadCount(click.ParamType):
    """``--threads``: a whole number from 1 to :data:`MAX_THREADS`."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            number = int(value)
        except (TypeError, ValueError):
            number = 0
        if not 1 <= number <= MAX_THREADS or str(number) != str(value).strip().lstrip("+"):
            expected = f"expected a whole number of threads from 1 to {MAX_THREADS}"
            self.fail(f"{expected}; got {value!r}", param, ctx)
        return number


def threads_option(
    default: str = "$OMP_NUM_THREADS, else one per core not already busy (cores minus the load "
    "average), 1 to 4",
) -> Any:
    """``--threads`` of the commands that train in this process (``rmq train ...``, ``fit``, ``demo``)."""
    return click.option(
        "--threads", type=ThreadCount(), help=f"CPU threads for PyTorch [default: {default}]."
    )
