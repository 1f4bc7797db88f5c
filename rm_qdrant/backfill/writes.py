"""How an application's write through :class:`~rm_qdrant.backfill.dual.DualIndex` lands, in
either layout, without dropping what rm-qdrant does not manage.

A point may carry vectors besides the old and new model's (a team's ``text`` vector, a
sparse one): rm-qdrant calls them its *other* vectors. A write gives them for the points it
names, or not; a point that exists keeps those it is not given. Its payload is replaced when
the write gives one and kept when it gives None.

- One collection: an existing point is rewritten in place (its old and new vectors, and
  the other vectors given), a new point is written whole.
- Two collections: the point is written whole to new, with the other vectors it had
  (read from new, else from old) where the write does not give them; then it leaves old,
  or (a pair that keeps a rollback) is written to old too, hidden as migrated points are.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rm_qdrant.backfill.pair import PairRecord
from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import MIGRATED, user_payload
from rm_qdrant.store import Record, Store
from rm_qdrant.store.vectors import OtherVector

log = logging.getLogger(__name__)


def carried(store: Store, pair: PairRecord) -> dict[str, OtherVector]:
    """The other vectors of a pair's points, by name: in one collection, every vector but the
    old and new model's; in two, those of the new collection that old has too, alike."""
    if pair.single:
        spec = store.collection(pair.new_collection, pair.new_using)
        return {o.name: o for o in spec.extra if o.name != pair.vector}
    new = store.collection(pair.new_collection, pair.vector).extra
    if not new or not store.has_collection(pair.old_collection):
        return {o.name: o for o in new}
    old = set(store.collection(pair.old_collection, pair.vector).extra)
    return {o.name: o for o in new if o in old}


@dataclass(frozen=True)
class Write:
    """One checked write: the new model's vectors, and what goes with them.

    Attributes:
        bodies: each point's payload (rm-qdrant's fields removed), or None: keep the point's.
        old_vectors: the old model's vectors, where they go to old (None: they do not).
        others: each point's other vectors given (name -> value), or None: none given.
        old_there: the old vectors still exist (not dropped by a cutover).
    """

    ids: list[PointId]
    vectors: np.ndarray
    bodies: list[dict[str, Any] | None]
    old_vectors: np.ndarray | None
    others: list[dict[str, Any]] | None
    old_there: bool


def apply(store: Store, pair: PairRecord, write: Write, known: Mapping[str, OtherVector]) -> None:
    """Write ``write`` to the pair's collection(s) (see the module's doc)."""
    if pair.single:
        _write_single(store, pair, write)
    else:
        _write_paired(store, pair, write, known)
    if write.old_there and write.old_vectors is None and pair.keeps_writes_in_old:
        log.warning(
            "pair %r: %d points written without their old vectors live in new only: a rollback "
            "will not serve them (pass old_vectors=, or use upsert with images)",
            pair.name,
            len(write.ids),
        )


def _write_single(store: Store, pair: PairRecord, write: Write) -> None:
    name, ids = pair.new_collection, write.ids
    extras = write.others or [{} for _ in ids]
    if write.old_vectors is not None:
        extras = [{**e, pair.vector: row} for e, row in zip(extras, write.old_vectors.tolist(), strict=True)]
    existing = {r.id for r in store.retrieve(name, ids, with_payload=False)}
    old_rows = [k for k, i in enumerate(ids) if i in existing]
    new_rows = [k for k, i in enumerate(ids) if i not in existing]
    # Without its old vector, a rewritten point must not keep the previous image's.
    drop = (pair.vector,) if write.old_there and write.old_vectors is None else ()
    if old_rows:
        store.update_points(
            name,
            [ids[k] for k in old_rows],
            write.vectors[old_rows],
            vector=pair.new_using,
            others=_pick(extras, old_rows, {}),
            payloads=_pick(write.bodies, old_rows, None),
            drop=drop,
        )
    if new_rows:
        bodies = [write.bodies[k] or {} for k in new_rows]
        new_ids = [ids[k] for k in new_rows]
        others = _pick(extras, new_rows, {})
        store.upsert(name, new_ids, write.vectors[new_rows], bodies, vector=pair.new_using, others=others)


def _pick(rows: list[Any], picked: list[int], nothing: Any) -> list[Any] | None:
    """The rows ``picked``, or None where each is ``nothing`` (the plain write: nothing to carry)."""
    chosen = [rows[k] for k in picked]
    return None if all(row == nothing for row in chosen) else chosen


def _write_paired(store: Store, pair: PairRecord, write: Write, known: Mapping[str, OtherVector]) -> None:
    ids, bodies, others = write.ids, write.bodies, write.others
    lacking = bool(known) and any(set(known) - set(row) for row in (others or [{}]))
    keep = any(body is None for body in bodies)
    found = _existing(store, pair, ids, list(known) if lacking else [], keep, write.old_there)
    if keep:
        kept = {i: user_payload(r.payload) for i, r in found.items()}
        bodies = [kept.get(i, {}) if body is None else body for i, body in zip(ids, bodies, strict=True)]
    if lacking:
        given = others or [{} for _ in ids]
        others = [
            {**(found[i].others if i in found else {}), **row} for i, row in zip(ids, given, strict=True)
        ]
    carry = others if others and any(others) else None
    full = [body or {} for body in bodies]
    store.upsert(pair.new_collection, ids, write.vectors, full, vector=pair.vector, others=carry)
    if not write.old_there:
        return
    if write.old_vectors is not None:  # hidden from search as migrated points are; a rollback serves it
        hidden = [{**body, MIGRATED: 1} for body in full]
        store.upsert(pair.old_collection, ids, write.old_vectors, hidden, vector=pair.vector, others=carry)
    else:
        store.delete(pair.old_collection, ids)


def _existing(
    store: Store, pair: PairRecord, ids: list[PointId], names: list[str], payload: bool, old: bool
) -> dict[PointId, Record]:
    """The points of ``ids`` as they are, with the other vectors ``names``: from new, else old."""
    if not names and not payload:
        return {}
    found = {r.id: r for r in store.retrieve(pair.new_collection, ids, with_payload=payload, others=names)}
    rest = [i for i in ids if i not in found]
    if rest and old:
        old_points = store.retrieve(pair.old_collection, rest, with_payload=payload, others=names)
        found.update({r.id: r for r in old_points})
    return found
