"""Self-describing checkpoints: one dict with a ``kind``, its facts and its weights.

A checkpoint holds tensors and plain data (numbers, strings, lists, tuples, dicts)
only, and is read with PyTorch's restricted unpickler: a ``.pt`` from another team is
data, and one whose pickle would build any other object (a call of ``os.system``, a
class of its own) is refused before anything in it runs.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath, PureWindowsPath
from typing import Any, TypeVar

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


M = TypeVar("M", bound=torch.nn.Module)


@dataclass(frozen=True)
class Field:
    """What one field of a checkpoint must be: ``expected`` in words, ``test`` in code."""

    expected: str
    test: Callable[[Any], bool]
    required: bool = True
    keys: Mapping[str, Field] = field(default_factory=dict)  # a table's own fields, checked in turn


MAX_DIM = 1 << 16  # widths: far above any real model's, far below what would exhaust memory
MAX_CLASSES = 1_000_000


def _whole(low: int, high: int) -> Field:
    return Field(f"a whole number from {low} to {high}", lambda v: type(v) is int and low <= v <= high)


def _channels(low: float, high: float, words: str) -> Field:
    """3 numbers, one per channel, each from ``low`` to ``high`` (so finite, in float32 too)."""

    def test(value: Any) -> bool:
        return (
            isinstance(value, (list, tuple))
            and len(value) == 3
            and all(type(v) in (int, float) and math.isfinite(v) and low <= v <= high for v in value)
        )

    return Field(f"3 {words} (one per channel)", test)


def _table(required: bool = True, **keys: Field) -> Field:
    named = f" with {', '.join(map(repr, keys))}" if keys else ""
    return Field(f"a table (dict){named}", lambda v: isinstance(v, dict), required, keys)


def _optional(spec: Field) -> Field:
    return dataclasses.replace(spec, required=False)


_NAME = Field("a non-empty string", lambda v: isinstance(v, str) and v != "")
_TEXT = Field("a string", lambda v: isinstance(v, str))
_FLAG = Field("true or false", lambda v: type(v) is bool)
_DIM = _whole(1, MAX_DIM)
_BLOCKS = _whole(1, 5)
_CLASSES = Field(
    f"a list of 1 to {MAX_CLASSES} class names (strings)",
    lambda v: (
        isinstance(v, (list, tuple)) and 1 <= len(v) <= MAX_CLASSES and all(isinstance(c, str) for c in v)
    ),
)
_WEIGHTS = Field(
    "a table of named tensors",
    lambda v: isinstance(v, dict) and all(isinstance(k, str) and torch.is_tensor(t) for k, t in v.items()),
)

# Every field the code reads of each kind, checked when the file is loaded (``needs`` adds more).
SCHEMAS: dict[str, dict[str, Field]] = {
    "backbone": {
        "arch": _NAME,
        "stem": _NAME,
        "embed_dim": _DIM,
        "image_size": _whole(1, 4096),
        "mean": _channels(-1e30, 1e30, "finite numbers"),
        "std": _channels(1e-30, 1e30, "finite numbers above 0"),
        "classes": _CLASSES,
        "config": _table(required=False),
        "metric": _table(required=False),
        "state_dict": _WEIGHTS,
    },
    "heads": {
        "d_new": _DIM,
        "d_old": _DIM,
        "learn_rho": _FLAG,
        "rho_blocks": _BLOCKS,
        "psi_blocks": _BLOCKS,
        "hidden": _DIM,
        "config": _table(loss=_NAME),
        "old_checkpoint": _optional(_TEXT),
        "new_checkpoint": _optional(_TEXT),
        "metric": _table(required=False),
        "state_dict": _WEIGHTS,
    },
    "adapter": {
        "adapter": _NAME,
        "d_in": _DIM,
        "d_out": _DIM,
        "config": _table(rank=_whole(0, MAX_DIM), hidden=_whole(0, MAX_DIM)),
        "state_dict": _WEIGHTS,
    },
    "side-info": {"dim": _DIM, "image_size": _whole(8, 4096), "state_dict": _WEIGHTS},
    "transformation": {
        "d_in": _DIM,
        "d_out": _DIM,
        "blocks": _BLOCKS,
        "hidden": _DIM,
        "old_checkpoint": _TEXT,
        "new_checkpoint": _TEXT,
        "side": _TEXT,
        "side_checkpoint": _optional(_TEXT),
        "state_dict": _WEIGHTS,
    },
}


def check_fields(
    value: Mapping[str, Any], schema: Mapping[str, Field], path: str | Path, kind: str, prefix: str = ""
) -> None:
    """Refuse the first field of ``value`` that ``schema`` does not allow, in one ValueError line."""
    for name, spec in schema.items():
        where = f"{prefix}{name}"
        if name not in value:
            if spec.required:
                raise ValueError(f"{path}: this {kind} checkpoint lacks {where!r}")
            continue
        if not spec.test(value[name]):
            raise ValueError(f"{path}: its {where!r} must be {spec.expected}, got {_shown(value[name])}")
        check_fields(value[name], spec.keys, path, kind, f"{where}.")


def _shown(value: Any) -> str:
    if torch.is_tensor(value):
        return f"a tensor of shape {list(value.shape)}"
    return reprlib.repr(value)


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
    check_fields(checkpoint, SCHEMAS.get(kind, {}), path, kind)
    missing = [name for name in (*needs, "state_dict") if name not in checkpoint]
    if missing:
        raise ValueError(f"{path}: this {kind} checkpoint lacks {missing[0]!r}")
    return checkpoint


def build(make: Callable[[], M], checkpoint: dict[str, Any], path: str | Path) -> M:
    """``make()``'s model with the checkpoint's weights in it.

    The model is first built without memory (on PyTorch's ``meta`` device) and its weights'
    names and shapes compared with the file's: a file that describes a model larger than
    the weights it holds allocates nothing, and a model the code refuses (an unknown arch,
    a size it cannot take) is one ValueError naming the file.
    """
    try:
        with torch.device("meta"):
            shell = make()
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    _same_shapes(shell.state_dict(), checkpoint["state_dict"], path)
    return restore(make(), checkpoint, path)


def _same_shapes(wanted: Mapping[str, torch.Tensor], found: Mapping[str, Any], path: str | Path) -> None:
    for name, tensor in wanted.items():
        have = found.get(name)
        if not torch.is_tensor(have) or have.shape != tensor.shape:
            held = list(have.shape) if torch.is_tensor(have) else "nothing"
            raise ValueError(
                f"{path}: its weights do not fit the model it describes "
                f"({name}: the file holds {held}, the model needs {list(tensor.shape)})"
            )
    extra = sorted(set(found) - set(wanted))
    if extra:
        raise ValueError(f"{path}: its weights do not fit the model it describes (unexpected {extra[0]})")


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
