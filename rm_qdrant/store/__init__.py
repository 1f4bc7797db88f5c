"""Opening a store: embedded folder, in-memory, or a Qdrant server, by one location string."""

from __future__ import annotations

import os

from rm_qdrant.store.base import CollectionSpec, Filter, Record, ScoredRecord, Store, Where, normalize_id

__all__ = [
    "CollectionSpec",
    "Filter",
    "Record",
    "ScoredRecord",
    "Store",
    "Where",
    "normalize_id",
    "open_store",
]


def open_store(location: str | os.PathLike[str], *, api_key: str | None = None, create: bool = True) -> Store:
    """Open the store at ``location``, as qdrant-client users would name it.

    Args:
        location: ``http://host:6333`` or ``https://...`` for a Qdrant server,
            ``":memory:"`` for a throwaway in-process store, anything else is the
            folder of an embedded on-disk store.
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
    from rm_qdrant.store.edge import EdgeStore

    return EdgeStore(text, create=create)
