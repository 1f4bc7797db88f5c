"""Stand-ins for the lead's rm_qdrant.pair.progress.recorded_pace and
rm_qdrant.pair.control.is_paused until they land on main (deleted at the merge)."""

from __future__ import annotations

from dataclasses import dataclass

from rm_qdrant.store import Store


@dataclass(frozen=True)
class Pace:
    points_per_second: float | None
    eta_seconds: float | None


def recorded_pace(store: Store, name: str, remaining: int) -> Pace:
    return Pace(None, None)


def is_paused(store: Store, name: str) -> bool:
    return False
