"""The embedded store's folder, apart from its shards: the lock that admits one process, which
folders are collections, and the aliases file (qdrant-edge has no aliases)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from pathlib import Path
from typing import IO

from rm_qdrant.errors import StoreLocked

log = logging.getLogger("rm_qdrant.store.edge")


def acquire_lock(folder: Path) -> IO[str]:
    """Lock ``folder`` for this process (flock on ``.rmq-lock``, which records the pid).

    Raises:
        StoreLocked: another process holds it.
    """
    handle = open(folder / ".rmq-lock", "a+")  # noqa: SIM115 - held open for the store's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise StoreLocked(
            f"embedded store {folder} is locked by another process (pid {holder}); "
            "the embedded store admits one process at a time, use a Qdrant server "
            "to share it"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def read_aliases(folder: Path) -> dict[str, str]:
    """Every alias of the store: alias -> collection."""
    try:
        return dict(json.loads((folder / "aliases.json").read_text()))
    except FileNotFoundError:
        return {}


def write_aliases(folder: Path, aliases: dict[str, str]) -> None:
    """Replace the aliases file atomically."""
    tmp = folder / "aliases.json.tmp"
    tmp.write_text(json.dumps(aliases, sort_keys=True))
    os.replace(tmp, folder / "aliases.json")


def is_collection(folder: Path) -> bool:
    """Whether ``folder`` (under ``collections/``) holds a collection: made by rm-qdrant, or a
    team's shard placed there, and not one being created or deleted."""
    if (folder / "spec.json").is_file():
        return True  # made by rm-qdrant
    return (folder / "shard" / "edge_config.json").is_file() and not (folder / ".creating").exists()


def remove_leftovers(collections: Path) -> None:
    """Remove what a create or delete killed half-way left (its ``.creating`` marker): no
    collection (the lock makes this process the only one here), so its files go now."""
    for folder in collections.iterdir():
        if (folder / ".creating").exists():
            log.info("removing the leftovers of an interrupted create or delete: %s", folder)
            shutil.rmtree(folder, ignore_errors=True)
