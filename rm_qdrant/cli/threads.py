"""``--threads``, the training's log lines, and what a command that needs PyTorch says without it:
shared by ``rmq fit`` and the training commands (train/cli.py), which import this module and not
the commands' (training.py, which loads train/cli.py: the two would import each other)."""

from __future__ import annotations

import logging
from typing import Any

import click

from rm_qdrant.errors import ConfigError


def needs_torch(exc: ModuleNotFoundError) -> click.ClickException:
    if exc.name in ("torch", "yaml", "onnx"):
        return click.ClickException(
            f"this needs {exc.name}: pip install -e '.[train,export]' (pins the CPU build, torch==2.13.0)"
        )
    raise exc


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


def choose_threads(threads: int | None, *, default: int | None = None) -> Any:
    """The thread count a training command will use (``--threads``, ``OMP_NUM_THREADS``, the
    load), chosen before torch loads: a bad ``OMP_NUM_THREADS`` is one line, exit 1."""
    try:
        from rm_qdrant_train.threads import choose_threads as choose
    except ModuleNotFoundError as exc:
        raise needs_torch(exc) from exc
    try:
        return choose(threads, default=default)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def apply_threads(choice: Any) -> Any:
    """Give PyTorch the chosen thread count (:func:`rm_qdrant_train.threads.apply_threads`)."""
    from rm_qdrant_train.threads import apply_threads as apply

    try:
        return apply(choice)
    except ModuleNotFoundError as exc:
        raise needs_torch(exc) from exc
