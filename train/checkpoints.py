"""Self-describing checkpoints: one dict with a ``kind``, its facts and its weights.

A checkpoint holds tensors and plain data (numbers, strings, lists, tuples, dicts)
only, and is read with PyTorch's restricted unpickler: a ``.pt`` from another team is
data, and one whose pickle would build any other object (a call of ``os.system``, a
class of its own) is refused before anything in it runs.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Sequence
from pathlib import Path, PurePath, PurePosixPath, PureWindowsPath
from typing import Any

import torch


def plain_config(cfg: Any) -> dict[str, Any]:
    """A dataclass config as plain data (paths as strings), as a checkpoint stores it."""
    return {k: str(v) if isinstance(v, PurePath) else v for k, v in dataclasses.asdict(cfg).items()}


def save_checkpoint(checkpoint: dict[str, Any], out: str | Path) -> Path:
    """Write ``checkpoint`` atomically (a crash never leaves half a file at ``out``)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(checkpoint, tmp)
    tmp.replace(path)
    return path


# Checkpoints written before configs were stored as plain data hold path objects:
# rebuilding one runs no code of the file's choosing, so those stay readable.
_PATHS = [Path, PurePosixPath, PureWindowsPath, type(Path())]


def load_checkpoint(path: str | Path, kind: str, *, needs: Sequence[str] = ()) -> dict[str, Any]:
    """Read a checkpoint of ``kind`` (``backbone``, ``heads``, ``adapter``, ...) without running it.

    Args:
        needs: the fields the caller reads; a checkpoint lacking one is refused here, in one line.

    Raises:
        ValueError: the file is not an rm-qdrant checkpoint of that kind, holds anything
            but tensors and plain data, or lacks a field in ``needs``.
    """
    try:
        with torch.serialization.safe_globals(_PATHS):
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"{path} is not plain data (tensors, numbers, strings): refused without running it "
            f"({_first_line(exc)})"
        ) from exc
    except (RuntimeError, EOFError, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(f"{path} is not a PyTorch checkpoint ({_first_line(exc)})") from exc
    if not isinstance(checkpoint, dict) or checkpoint.get("kind") != kind:
        raise ValueError(f"{path} is not an rm-qdrant {kind} checkpoint")
    missing = [name for name in (*needs, "state_dict") if name not in checkpoint]
    if missing:
        raise ValueError(f"{path}: this {kind} checkpoint lacks {missing[0]!r}")
    return checkpoint


def restore(model: torch.nn.Module, checkpoint: dict[str, Any], path: str | Path) -> torch.nn.Module:
    """Load the checkpoint's weights into ``model``; weights of another shape are one ValueError."""
    try:
        model.load_state_dict(checkpoint["state_dict"])
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"{path}: its weights do not fit the model it describes ({_first_line(exc)})"
        ) from exc
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def description(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint without its weights."""
    return {k: v for k, v in checkpoint.items() if k != "state_dict"}
