"""Reading a gallery image from the local file system, bounded and never blocking."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from rm_qdrant.errors import SourceError

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CHUNK = 1 << 20
#: How a file appears in errors: the text, or a function that makes it (called only on an error:
#: redacting a URI costs more than reading a small file).
Shown = str | Callable[[], str]


def confine(target: Path, root: Path, *, shown: Shown) -> Path:
    """``target`` with every symbolic link and ``..`` resolved, if that lies under ``root``.

    A relative ``target`` is taken under ``root``, an absolute one as it is; either way
    the path it resolves to must be ``root`` or below it, so ``..``, an absolute path or
    a symbolic link (inside ``root``) that points outside it is refused. ``root`` is
    already resolved. Open the result with ``follow=False`` (:func:`read_file`) so that
    its last component cannot become a link between this check and the open.

    Raises:
        SourceError: the path resolves outside ``root``, or cannot be resolved.
    """
    try:
        resolved = (root / target).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a link loop; a NUL byte in the path
        raise SourceError(f"{_text(shown)}: {_reason(exc)}") from exc
    if not resolved.is_relative_to(root):
        raise SourceError(f"{_text(shown)}: resolves outside --root ({root}); refused")
    return resolved


def read_file(target: str | Path, *, max_bytes: int, shown: Shown, follow: bool = True) -> bytes:
    """The bytes of the regular file ``target``, at most ``max_bytes`` of them.

    Opened without blocking (a FIFO would otherwise wait forever for a writer) and
    read with a bound (``/dev/zero`` reports a size of 0 and never ends); anything
    but a regular file is refused. ``shown`` is how the file appears in errors.
    ``follow=False``: a symbolic link as the last component is refused, not followed.

    Raises:
        SourceError: the file is missing, unreadable, not a regular file or too large.
    """
    try:
        fd = os.open(target, _FLAGS if follow else _FLAGS | _NOFOLLOW)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise SourceError(f"{_text(shown)}: {_reason(exc)}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SourceError(f"{_text(shown)}: not a regular file")
        if info.st_size > max_bytes:
            raise SourceError(f"{_text(shown)}: {info.st_size} bytes is over the {max_bytes}-byte limit")
        # One read of the size fstat gave (no chunks to join: a photo is megabytes), then
        # chunks while the file still gives bytes (it grew, or reports no size, as /proc does).
        first = os.read(fd, min(info.st_size, max_bytes) + 1)
        chunks, size = [first], len(first)
        while size <= max_bytes and (chunk := os.read(fd, min(_CHUNK, max_bytes + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise SourceError(f"{_text(shown)}: over the {max_bytes}-byte limit")
        return first if len(chunks) == 1 else b"".join(chunks)
    except OSError as exc:
        raise SourceError(f"{_text(shown)}: {_reason(exc)}") from exc
    finally:
        os.close(fd)


def _text(shown: Shown) -> str:
    return shown if isinstance(shown, str) else shown()


def _reason(exc: Exception) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
