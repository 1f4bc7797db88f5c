"""Where rm-qdrant keeps caches: the platform's cache folder, never the working directory."""

from __future__ import annotations

import os
from pathlib import Path

#: Set it (or ``--cache-dir``) to put every cache elsewhere.
CACHE_ENV = "RMQ_CACHE_DIR"


def cache_root() -> Path:
    """``$RMQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/rm-qdrant``, else ``~/.cache/rm-qdrant``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rm-qdrant"


def human_size(path: Path) -> str:
    """A file's size as people read it (``1.7 MB``)."""
    size = float(path.stat().st_size)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1000
    return f"{size:,.1f} GB"
