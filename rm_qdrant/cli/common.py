"""What every ``rmq`` command shares: error handling, the store, output."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from rm_qdrant.api.common import Step
from rm_qdrant.core.inputspec import DECODES
from rm_qdrant.core.redact import redact
from rm_qdrant.errors import Refused, RmqError
from rm_qdrant.sources.settings import (
    shown_header,
)
from rm_qdrant.store import Store, open_store


class CollectionName(click.ParamType):
    """A collection or pair name: 1 to 255 characters, as Qdrant takes (and file systems hold)."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not str(value):
            self.fail("a name cannot be empty.", param, ctx)
        if len(str(value)) > 255:
            self.fail(f"too long ({len(str(value))} characters): a name takes 1 to 255.", param, ctx)
        if not _is_text(str(value)):
            self.fail(f"{value!r} is not text (bytes that are not UTF-8).", param, ctx)
        return str(value)


def _is_text(value: str) -> bool:
    """False for a string holding bytes the system could not decode (surrogate escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


COLLECTION = CollectionName()
name_option = click.option("--name", required=True, type=COLLECTION, help="The pair's name.")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def pair_name(command: Callable[..., Any]) -> Callable[..., Any]:
    """The pair's name as ``rmq plan NAME`` (and ``pause``, ``resume``) take it, or as ``--name
    NAME`` like the other commands; the command gets it as ``name``."""

    @functools.wraps(command)
    def run(*args: Any, name_arg: str | None, name: str | None, **kwargs: Any) -> Any:
        if name_arg is not None and name is not None and name_arg != name:
            raise click.UsageError(f"two pair names, {name_arg!r} and --name {name!r}: give one")
        if (name_arg or name) is None:
            raise click.UsageError("which pair? give its name: NAME or --name NAME")
        return command(*args, name=name_arg or name, **kwargs)

    run = click.option("--name", type=COLLECTION, help="The pair's name (or NAME).")(run)
    return click.argument("name_arg", metavar="[NAME]", required=False, type=COLLECTION)(run)


def new_model_option(use: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--new-model`` of ``rmq eval`` and ``rmq probe``: the plain new model, for ``use``."""
    return click.option(
        "--new-model",
        type=click.Path(),
        help=f"The plain new model (no ψ/ρ heads) an rm pair's graph was trained from: {use} "
        "[default: a naive pair's encoder; an rm pair's recorded one (rmq init/switch-encoder --new-model)].",
    )


def decode_option(
    help: str, *, default: str | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--decode exact|fast``: how images are decoded (see docs/guides/models.md); ``default``
    None: the pair's recorded mode."""
    return click.option(
        "--decode",
        type=click.Choice(DECODES),
        default=default,
        show_default=default is not None,
        help=help,
    )


#: The exit status of a command that ran as asked but kept nothing (``calibrate``, ``fit``,
#: ``switch-encoder``); 1 is a failure, 0 a result kept.
NOT_KEPT = 3
EXIT_STATUS_HELP = (
    "Exit status: 0 kept; 3 ran but kept nothing (one 'Not kept: REASON' line on stderr, "
    "nothing changed); 1 error."
)


class NotKept(click.ClickException):
    """A command that ran and refused to keep its result: exit 3 and one ``Not kept:`` line."""

    exit_code = NOT_KEPT

    def show(self, file: Any = None) -> None:
        click.echo(f"Not kept: {self.format_message()}", err=True)


class Group(click.Group):
    """Turns library errors and bad options into one line on stderr and exit code 1.

    Every message is shown with credentials redacted and control characters escaped; a
    name too long for the file system is an error like any other, not a traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Refused as exc:
            raise NotKept(safe_text(str(exc))) from exc
        except RmqError as exc:
            raise click.ClickException(safe_text(str(exc))) from exc
        except click.UsageError as exc:  # click would print the usage too, and exit 2
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            raise click.ClickException(safe_text(exc.format_message() + hint)) from exc
        except click.ClickException as exc:
            exc.message = safe_text(exc.message)
            raise
        except OSError as exc:
            raise click.ClickException(safe_text(os_error(exc))) from exc
        except UnicodeEncodeError as exc:  # an argument of bytes that are not UTF-8, say
            raise click.ClickException(safe_text(f"a value is not UTF-8 text: {exc.object!r}")) from exc


def os_error(exc: OSError) -> str:
    """One line for an OSError that reached the command line, its file name shortened."""
    name = exc.filename if isinstance(exc.filename, str) else None
    if name is None:
        return str(exc)
    shown = name if len(name) <= 120 else f"{name[:60]}...{name[-40:]} ({len(name)} characters)"
    if exc.errno == errno.ENAMETOOLONG:
        return f"name too long for the file system: {shown}"
    return f"{exc.strerror or exc}: {shown}"


class FiniteFloat(click.FloatRange):
    """A FloatRange that refuses nan and infinities (nan passes any bound, 1e309 is inf)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number

    def _describe_range(self) -> str:
        """Help text's bounds; none when it has none (click would print ``x<=None``)."""
        return "" if self.min is None and self.max is None else super()._describe_range()


#: Seeds: numpy, random and torch all take 0 to 2**32 - 1.
SEED = click.IntRange(0, 2**32 - 1)


def store_location(ctx: click.Context) -> str:
    """The --qdrant value, a local folder made absolute (a key that does not depend on the cwd)."""
    location = ctx.find_root().obj["qdrant"]
    return location if location == ":memory:" or "://" in location else str(Path(location).resolve())


def open_cli_store(ctx: click.Context, *, create: bool = False) -> Store:
    """The --qdrant store; only commands that fill a store may create it (a typo is an error)."""
    obj = ctx.find_root().obj
    if obj.get("store") is None:
        obj["store"] = open_store(obj["qdrant"], api_key=obj["api_key"], create=create)
        ctx.find_root().call_on_close(obj["store"].close)
    return obj["store"]


def plain(value: object) -> str:
    """Text from a payload made safe for a terminal: control characters shown escaped.

    ESC, CR, BEL, DEL, the C1 controls, line and paragraph separators and bidi overrides
    are written as Python escapes (``\\x1b``), so a stored name can neither drive the
    terminal nor forge a line of output.
    """
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))


def safe_text(text: str) -> str:
    """Output text as ``rmq`` prints it: each line redacted (:func:`redact`) and :func:`plain`."""
    return "\n".join(plain(redact(line)) for line in text.split("\n"))


def public(data: Any) -> Any:
    """JSON-ready ``data`` with every string (keys too) redacted; json.dumps escapes the rest."""
    if isinstance(data, dict):
        return {public(k): public(_headers_shown(k, v)) for k, v in data.items()}
    if isinstance(data, list):
        return [public(v) for v in data]
    return redact(data) if isinstance(data, str) else data


def _headers_shown(key: Any, value: Any) -> Any:
    """A ``headers`` entry's values as ``***`` (or ``$VAR``): HTTP headers are secrets."""
    if key != "headers" or not isinstance(value, (list, tuple)):
        return value
    return [shown_header(tuple(h)) if isinstance(h, (list, tuple)) and len(h) == 2 else "***" for h in value]


def emit(data: Any, as_json: bool, text: str) -> None:
    """Print a command's result: JSON (ASCII, control characters escaped) or text, redacted."""
    if as_json:
        click.echo(json.dumps(public(json.loads(json.dumps(data, default=str))), indent=2))
    else:
        click.echo(safe_text(text))


class RedactingFormatter(logging.Formatter):
    """Log lines as ``rmq`` shows them: credentials redacted, control characters escaped.

    It wraps a handler's own formatter and leaves the record as it was: other handlers of
    the same record (an application's, a test's) still get its message and arguments.
    """

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return safe_text(self.inner.format(record))


def quiet(ctx: click.Context) -> bool:
    """Whether ``rmq -q`` asked for no progress output."""
    return bool(ctx.find_root().obj.get("quiet"))


class Progress:
    """A progress bar on stderr that starts once the total is known and shows a rate.

    Thread-safe: workers may report from several threads. Hidden with ``rmq -q`` and
    with ``--json`` (whose output is for scripts).
    """

    def __init__(self, label: str, *, hidden: bool, unit: str = "points") -> None:
        self.label, self.hidden, self.unit = label, hidden, unit
        self.done, self.started = 0, time.perf_counter()
        self._stack = contextlib.ExitStack()
        self._bar: Any = None
        self._lock = threading.Lock()

    def start(self, total: int) -> None:
        bar = click.progressbar(
            length=total,
            label=safe_text(self.label),
            hidden=self.hidden,
            item_show_func=self._rate,
            file=sys.stderr,
        )
        self._bar = self._stack.enter_context(bar)

    def _rate(self, _: Any) -> str:
        return f"{self.done / max(time.perf_counter() - self.started, 1e-9):,.0f} {self.unit}/s"

    def advance(self, steps: int = 1, *, done: int | None = None) -> None:
        """Move the bar ``steps``; ``done`` (default ``steps``) counts towards the rate."""
        with self._lock:
            self.done += steps if done is None else done
            if self._bar is not None:
                self._bar.update(steps)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


class Steps:
    """A library call's ``on_step`` as ``rmq`` shows it: a :class:`Progress` bar per counted step,
    each uncounted step's line on stderr; nothing when hidden (``rmq -q``, ``--json``).

    Thread-safe. Leaving the ``with`` block closes a bar a failed call left open.
    """

    def __init__(self, *, hidden: bool) -> None:
        self.hidden = hidden
        self._bar: Progress | None = None
        self._shown = 0
        self._lock = threading.Lock()

    def __call__(self, step: Step) -> None:
        with self._lock:
            if step.total is None:
                if not self.hidden:
                    click.echo(step.label, err=True)
                return
            if self._bar is None or (step.done == 0 and not step.finished):
                self._close()
                self._bar = Progress(step.label, hidden=self.hidden, unit=step.unit)
                self._bar.start(step.total)
                self._shown = 0
            self._bar.advance(step.done - self._shown)
            self._shown = step.done
            if step.finished:
                self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._close()


def holdout_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--sample``, ``--holdout``, ``--k`` and ``--seed`` of the commands that fit on a gallery sample."""
    options = [
        click.option(
            "--sample",
            "size",
            default=20000,
            show_default=True,
            type=click.IntRange(min=8),
            help="Points to sample.",
        ),
        click.option(
            "--holdout",
            default=0.1,
            show_default=True,
            type=FiniteFloat(min=0, max=0.5, min_open=True),
            help="Share of the sample kept out of the fit for the forecast.",
        ),
        click.option(
            "--k", default=10, show_default=True, type=click.IntRange(min=1), help="Neighbours compared."
        ),
        click.option(
            "--seed",
            default=0,
            show_default=True,
            type=SEED,
            help="Seed of the sample, the split and training.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command
