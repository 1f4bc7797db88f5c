"""The image-source options every command that reads images takes, merged with what the pair
records: ``rmq init`` records them, later commands use them, and a value given on the command
line overrides it for that run (and says so)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import click

from rm_qdrant.cli.common import FiniteFloat, open_cli_store, safe_text
from rm_qdrant.errors import CollectionNotFound
from rm_qdrant.pair.record import load_pair
from rm_qdrant.sources import SourceConfig
from rm_qdrant.sources.settings import (
    OPTIONS,
    from_settings,
    header_values,
    parse_header,
    shown_value,
)


def _source_option_list() -> list[Callable[..., Any]]:
    return [
        click.option(
            "--root",
            type=click.Path(file_okay=False),
            help="Folder that local image paths must resolve under (relative paths are taken under it).",
        ),
        click.option(
            "--allow-scheme",
            "schemes",
            multiple=True,
            default=SourceConfig.schemes,
            show_default=True,
            help="URI schemes images may come from (repeatable).",
        ),
        click.option(
            "--timeout",
            default=10.0,
            show_default=True,
            type=FiniteFloat(min=0, min_open=True, max=3600),
            help="Seconds one attempt at fetching an image may take in all (connect, redirects, "
            "body); a timed-out attempt is retried twice.",
        ),
        click.option(
            "--max-pixels",
            default=SourceConfig.max_pixels,
            show_default=True,
            type=click.IntRange(min=1),
            help="Refuse images whose header declares more pixels (bounds decoding memory).",
        ),
        click.option(
            "--allow-private-network",
            "allow_private",
            is_flag=True,
            help="Let http(s) images come from loopback, private, link-local or metadata addresses "
            "(refused by default: the URIs come from payloads).",
        ),
        click.option(
            "--http-header",
            "headers",
            multiple=True,
            help="'Name: value' sent with every http(s) image fetch (repeatable); write the value "
            "as $VAR to read it from the environment at run time. Values are never shown.",
        ),
    ]


def _given_settings(ctx: click.Context, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pops the source options from ``kwargs``; returns those given (not defaults), as plain data."""
    values = {key: kwargs.pop(key) for key in OPTIONS}
    given = {
        key: value
        for key, value in values.items()
        if ctx.get_parameter_source(key) not in (None, click.core.ParameterSource.DEFAULT)
    }
    if "root" in given:
        given["root"] = os.path.abspath(given["root"])  # a later run may start elsewhere
    if "schemes" in given:
        given["schemes"] = list(given["schemes"])
    if "headers" in given:
        given["headers"] = [list(parse_header(h)) for h in given["headers"]]
        if not given["headers"]:
            del given["headers"]
    return given


def _recorded_settings(ctx: click.Context, name: str | None) -> dict[str, Any]:
    """The settings the pair ``name`` recorded at ``rmq init`` (none for a pair not there yet)."""
    if name is None:
        return {}
    try:
        return dict(load_pair(open_cli_store(ctx), name).source or {})
    except CollectionNotFound:
        return {}  # the command itself says so


def merge_settings(recorded: dict[str, Any], given: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Recorded settings with the given ones on top, and what each override replaced.

    Headers merge by name (case-insensitive): a header given replaces the recorded one of
    that name and leaves the others.
    """
    merged, said = {**recorded, **given}, []
    if "headers" in given and "headers" in recorded:
        names = {n.lower() for n, _ in given["headers"]}
        kept = [h for h in recorded["headers"] if h[0].lower() not in names]
        merged["headers"] = kept + given["headers"]
    for key, value in given.items():
        before = recorded.get(key)
        if key == "headers" and before is not None:
            names = {n.lower() for n, _ in value}
            before = [h for h in before if h[0].lower() in names] or None
        if before is not None and before != value:
            said.append(
                f"using {OPTIONS[key]} {shown_value(key, value)} for this run "
                f"(the pair records {shown_value(key, before)})"
            )
    return merged, said


def source_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Where images come from and what is accepted; the command gets one ``source`` argument.

    A command that takes ``--name`` starts from the settings the pair recorded at ``rmq
    init``; a value given on the command line overrides one for this run, said on stderr.
    """

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        given = _given_settings(ctx, kwargs)
        merged, said = merge_settings(_recorded_settings(ctx, kwargs.get("name")), given)
        kwargs["source"] = SourceConfig(**from_settings(merged))
        header_values(kwargs["source"].headers)  # a $VAR not set: say so before any work
        if said:
            click.echo(safe_text("; ".join(said)), err=True)
        return command(*args, **kwargs)

    for option in reversed(_source_option_list()):
        wrapper = option(wrapper)
    return wrapper


def recorded_source_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The source options of ``rmq init``: the command gets ``source_settings``, the values
    given (plain data, to record in the pair), checked as a SourceConfig would take them."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = _given_settings(click.get_current_context(), kwargs)
        SourceConfig(**from_settings(given))
        kwargs["source_settings"] = given
        return command(*args, **kwargs)

    for option in reversed(_source_option_list()):
        wrapper = option(wrapper)
    return wrapper


def source_lines(settings: dict[str, Any] | None) -> str:
    """The recorded settings as ``rmq status`` shows them: options, header values redacted."""
    if not settings:
        return "defaults (rmq init recorded no source options)"
    parts = []
    for key, option in OPTIONS.items():
        if key not in settings:
            continue
        value = settings[key]
        parts.append(option if key == "allow_private" and value else f"{option} {shown_value(key, value)}")
    return " ".join(parts)
