"""The re-rank options of ``rmq search``, ``init``, ``switch-encoder``, ``eval``, ``probe`` and
``fit`` (see :mod:`rm_qdrant.core.rerank`): one definition of each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import click

from rm_qdrant.cli.common import FiniteFloat
from rm_qdrant.core.merge import Hit
from rm_qdrant.core.rerank import DEFAULT_DEADLINE, MAX_RERANK, Rerank, recorded_rerank
from rm_qdrant.errors import ConfigError
from rm_qdrant.pair.record import PairRecord

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def rerank_option(use: str, *, dest: str = "rerank") -> Decorator:
    """``--rerank K``: the merged first K re-ranked by the new model, for ``use``; the command
    gets it as ``dest`` (None when not given)."""
    return click.option(
        "--rerank",
        dest,
        type=click.IntRange(1, MAX_RERANK),
        metavar="K",
        help=f"Re-rank each query's merged first K (1 to {MAX_RERANK:,}) with the new model: {use}.",
    )


def deadline_option(help: str) -> Decorator:
    """``--rerank-deadline SECONDS`` (finite, > 0)."""
    return click.option(
        "--rerank-deadline", type=FiniteFloat(min=0, min_open=True), metavar="SECONDS", help=help
    )


def no_rerank_alone(no_rerank: bool, others: bool, meaning: str) -> None:
    """Refuse ``--no-rerank`` given with other re-rank options (``meaning``: what it does)."""
    if no_rerank and others:
        raise click.UsageError(f"--no-rerank {meaning}: give it without the other re-rank options")


_OPTIONS = (
    rerank_option(
        "the old hits among them are embedded from their source (the pair's source rules) and the K "
        "ordered by the new model's distances",
        dest="rerank_k",
    ),
    deadline_option(
        f"Seconds a query waits for the old hits' images [default: {DEFAULT_DEADLINE}]; "
        "one not read by then keeps its merged distance (flagged late)."
    ),
    click.option(
        "--rerank-budget",
        type=click.IntRange(min=0),
        metavar="N",
        help="Most images one query reads, closest first [default: K]; 0: cached vectors only.",
    ),
    click.option(
        "--promote",
        is_flag=True,
        default=None,
        help="Write the vectors a re-rank embedded to new (the migration's claim/settle): "
        "points users see migrate first.",
    ),
)


def rerank_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--rerank K``, ``--rerank-deadline``, ``--rerank-budget`` and ``--promote``."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def chosen_rerank(
    base: Rerank | None, k: int | None, deadline: float | None, budget: int | None, promote: bool | None
) -> Rerank | None:
    """The re-rank the options give, over ``base`` (the pair's recorded one, or None).

    Raises:
        click.UsageError: a deadline, budget or --promote with no re-rank to apply them to.
    """
    if k is not None:
        base = Rerank(k) if base is None else replace(base, k=k)
    tuned = {"deadline": deadline, "budget": budget, "promote": promote}
    tuned = {key: value for key, value in tuned.items() if value is not None}
    if base is None:
        if tuned:
            flags = ", ".join("--" + ("rerank-" + key if key != "promote" else key) for key in tuned)
            raise click.UsageError(f"{flags} tune a re-rank: give --rerank K too")
        return None
    return replace(base, **tuned)


def recorded(pair: PairRecord, k: int | None) -> Rerank | None:
    """Pair ``pair``'s recorded re-rank, the base the options tune; where ``--rerank K`` is
    given (``k``), one this version cannot read is left out (K replaces it: the way to repair it).

    Raises:
        ConfigError: the recorded re-rank cannot be read, and no K replaces it.
    """
    try:
        return recorded_rerank(pair.rerank, pair.name)
    except ConfigError:
        if k is None:
            raise
        return None


def described(rerank: Rerank | None) -> str:
    """One line for a re-rank setting."""
    if rerank is None:
        return "re-rank: none"
    budget = "K" if rerank.budget is None else str(rerank.budget)
    promote = ", promoting" if rerank.promote else ""
    return f"re-rank: first {rerank.k}, deadline {rerank.deadline:g} s, fetch budget {budget}{promote}"


def tally(hits: list[Hit]) -> str | None:
    """What a re-rank did to the hits shown (None: no hit was re-ranked)."""
    states: dict[str, int] = {}
    for hit in hits:
        if hit.rerank is not None:
            states[hit.rerank] = states.get(hit.rerank, 0) + 1
    if not states:
        return None
    return "re-ranked: " + ", ".join(f"{n} {state}" for state, n in states.items())
