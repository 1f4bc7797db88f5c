"""Opening a store: embedded folder, in-memory, or a Qdrant server, by one location string."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rm_qdrant.errors import StoreError
from rm_qdrant.store.base import Capabilities, CollectionSpec, Filter, Record, ScoredRecord, Store, Where
from rm_qdrant.store.ids import normalize_id

__all__ = [
    "Capabilities",
    "CollectionSpec",
    "Filter",
    "Record",
    "ScoredRecord",
    "Store",
    "Where",
    "linked_shard",
    "normalize_id",
    "open_store",
    "shard_path",
]


def open_store(location: str | os.PathLike[str], *, api_key: str | None = None, create: bool = True) -> Store:
    """Open the store at ``location``, as qdrant-client users would name it.

    Args:
        location: ``http://host:6333`` or ``https://...`` for a Qdrant server,
            ``":memory:"`` for a throwaway in-process store, or a folder: a folder that
            ``QdrantClient(path=...)`` wrote (it holds ``meta.json``) opens through
            qdrant-client's local mode, the same calls a server gets; any other folder
            is an embedded (qdrant-edge) store.
        api_key: API key for a server; defaults to ``$QDRANT_API_KEY``.
        create: create an embedded store where the folder holds none (False: StoreError,
            so a mistyped folder is not taken for an empty store).

    Example:
        >>> store = open_store(":memory:")
        >>> store.create_collection("photos", dim=4, distance="cosine")
    """
    text = os.fspath(location)
    if text.startswith(("http://", "https://")):
        from rm_qdrant.store.client import ClientStore

        return ClientStore(text, api_key=api_key or os.environ.get("QDRANT_API_KEY"))
    if text == ":memory:":
        from rm_qdrant.store.client import ClientStore

        return ClientStore(text)
    folder = Path(text)
    if is_local_mode_folder(folder) and (folder / "collections").is_dir():
        raise StoreError(
            f"{folder} holds both an embedded store (collections/) and a qdrant-client folder (meta.json): "
            "keep them in separate folders"
        )
    if is_local_mode_folder(folder):
        from rm_qdrant.store.client import ClientStore

        return ClientStore(path=text)
    if (folder / "edge_config.json").is_file():
        raise StoreError(
            f"{folder} is a qdrant-edge shard, not a store: put it in a store as one collection, "
            f"e.g. mkdir -p STORE/collections/NAME && ln -s {folder.resolve()} STORE/collections/NAME/shard"
        )
    from rm_qdrant.store.edge import EdgeStore

    return EdgeStore(text, create=create)


def is_local_mode_folder(folder: Path) -> bool:
    """Whether ``folder`` was written by ``QdrantClient(path=...)`` (a ``meta.json`` with collections)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "collections" in meta


def linked_shard(store: Store, name: str) -> Path | None:
    """The real folder of collection ``name``'s shard when it is a team's shard adopted into an
    embedded store through a symbolic link; None for any other collection or store."""
    return store.linked_shard(name) if store.capabilities.shard_folders else None  # type: ignore[attr-defined]


def shard_path(store: Store, name: str) -> Path | None:
    """The folder of collection ``name``'s shard in an embedded store; None for other stores."""
    return store.shard_path(name) if store.capabilities.shard_folders else None  # type: ignore[attr-defined]
