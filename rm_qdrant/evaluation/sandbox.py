"""A throwaway copy of a pair in a temporary embedded store, to measure without moving the real one
(and an empty scratch store, where ``rmq plan`` times a sample's writes).

``rmq eval`` migrates the pair it measures step by step; run on the live pair, that
would leave a production gallery fully migrated. It runs on a copy instead: both
collections (vectors, payloads, payload indexes, rm-qdrant's ranks and marks) and the
pair record go into an embedded store in a temporary folder, removed afterwards.

A process killed with SIGKILL removes nothing, so each sandbox says whose it is: its
folder is named ``rmq-eval-<pid>-...`` and holds ``.owner``, locked (flock) by that
process for the sandbox's whole life; the kernel drops the lock when the process dies,
however it dies. The next sandbox removes the folders whose owner is gone, and never
one whose owner still runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO

import numpy as np

from rm_qdrant.core.merge import PointId
from rm_qdrant.migration.ranking import RANKING_INDEXES
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.record import PairRecord, record_collection_model, save_pair
from rm_qdrant.store import Record, Store, Where, open_store

log = logging.getLogger(__name__)

_PAGE = 2_000
PREFIX = "rmq-eval-"
_OWNER = ".owner"


def copy_collection(
    source: Store, target: Store, name: str, *, vector: str, on_points: Callable[[int], None] | None = None
) -> None:
    """Copy every point of ``name`` (its one vector ``vector`` and payload) into ``target``."""
    spec = source.collection(name, vector)
    target.create_collection(name, dim=spec.dim, distance=spec.distance, vector=vector)
    for field, kind in source.payload_indexes(name).items():
        target.create_index(name, field, kind)
    for page, rows in _pages(source, name, vector):
        if rows:
            vectors = np.stack([r.vector for r in rows])
            target.upsert(name, [r.id for r in rows], vectors, [r.payload for r in rows], vector=vector)
        if on_points is not None:
            on_points(len(page))


def _pages(
    source: Store, name: str, vector: str, where: Where | None = None
) -> Iterator[tuple[list[Record], list[Record]]]:
    """Each page of ``name`` with ``vector``: (every record, those that have the vector)."""
    offset: PointId | None = None
    while True:
        page, offset = source.scroll(
            name, limit=_PAGE, offset=offset, with_vectors=True, vector=vector, where=where
        )
        yield page, [r for r in page if r.vector is not None]
        if offset is None:
            return


@contextlib.contextmanager
def sandbox(
    store: Store, pair: PairRecord, *, on_points: Callable[[int], None] | None = None
) -> Iterator[tuple[Store, PairRecord]]:
    """A temporary embedded store holding a copy of ``pair``; yields (store, record).

    The copy is removed when the block ends, by an exception too; what a killed process
    left behind is removed when the next sandbox starts (:func:`remove_stale_sandboxes`).
    """
    with scratch_store() as copy:
        for name in dict.fromkeys((pair.old_collection, pair.new_collection)):
            copy_collection(store, copy, name, vector=pair.vector, on_points=on_points)
        # The ranking's indexes, whatever the source reports: qdrant-client's local mode (a
        # ``QdrantClient(path=...)`` folder, ``:memory:``) keeps none and lists none, and the copy,
        # an embedded store, orders the migration by ``rmq_rank`` only through its index.
        for field, kind in RANKING_INDEXES.items():
            copy.create_index(pair.old_collection, field, kind)
        layout = layout_of(pair)
        for name, vector, where in layout.vector_copies():
            _copy_vector(store, copy, name, vector, where)
        record = replace(pair, alias=None)
        save_pair(copy, record)
        record_collection_model(copy, layout.new_model_key, pair.encoder)
        yield copy, record


@contextlib.contextmanager
def scratch_store() -> Iterator[Store]:
    """An empty embedded store in a temporary folder of this process's (``rmq plan`` times its
    writes there), removed when the block ends, like a sandbox (:func:`remove_stale_sandboxes`)."""
    remove_stale_sandboxes()
    with _owned_folder() as folder, open_store(folder) as store:
        yield store


@contextlib.contextmanager
def _owned_folder() -> Iterator[Path]:
    """A new temporary folder named after this process, locked as ours until it is removed."""
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    handle = None
    try:
        handle = _claim(folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if handle is not None:
            handle.close()  # unlocked only once the folder is gone


def _claim(folder: Path) -> IO[str]:
    """Lock ``folder/.owner`` for this process; the file appears already locked (a rename)."""
    partial = folder / f"{_OWNER}.{os.getpid()}"
    handle = open(partial, "w")  # noqa: SIM115 - held open (locked) for the sandbox's life
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: no one else has it
    handle.write(str(os.getpid()))
    handle.flush()
    os.replace(partial, folder / _OWNER)
    return handle


def remove_stale_sandboxes(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the sandboxes that processes which are gone left in ``root`` (default: the temp folder).

    A sandbox goes when its ``.owner`` lock can be taken (its owner is dead), or, made too
    early to hold one, when the process its name carries is dead. Returns what was removed.
    """
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        if folder.is_dir() and not folder.is_symlink() and _abandoned(folder):
            log.info("removing %s, a scratch store left by an eval or a plan that was killed", folder)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _abandoned(folder: Path) -> bool:
    try:
        handle = open(folder / _OWNER)  # noqa: SIM115 - closed below
    except FileNotFoundError:
        match = re.match(rf"{PREFIX}(\d+)-", folder.name)
        return match is not None and not _alive(int(match.group(1)))
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its owner runs
            return False
        return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process, say
        return True
    return True


def _copy_vector(source: Store, target: Store, name: str, vector: str, where: Where) -> None:
    """A further vector of ``name`` (points that hold only it are not copied)."""
    spec = source.collection(name, vector)
    target.add_vector(name, vector, dim=spec.dim, distance=spec.distance)
    for _, rows in _pages(source, name, vector, where):
        if rows:
            target.set_vectors(name, [r.id for r in rows], np.stack([r.vector for r in rows]), vector=vector)
