"""What the library's one-call entry points share: progress reports (``on_step``), the pair's
image sources, the probe cache's key, and the lazy import of the training code."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rm_qdrant.errors import ConfigError
from rm_qdrant.evaluation.probe import ProbeSample, draw_sample
from rm_qdrant.migration.loading import preflight
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.models.text import load_encoder
from rm_qdrant.operations.indexing import ImageItem, scan_image_folder
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.sources import SourceConfig
from rm_qdrant.sources.settings import from_settings
from rm_qdrant.store import Store


@dataclass(frozen=True)
class Step:
    """Where a long call is, as its ``on_step`` callback is told.

    A counted step (``total`` set) is reported as it starts (``done`` 0), after each unit, and
    once more as it ends (``finished``; ``done`` may then fall short of ``total``, where images
    could not be read). A step with ``total`` None is one line to show, counted by nothing:
    what is being trained, or a note.

    Attributes:
        label: what the step does (``"re-embedding the sample"``, ``"copying the pair"``), or
            the line to show.
        done: units done so far.
        total: units in all; None for a line.
        unit: what is counted (``"images"``, ``"points"``).
        finished: the step's last report.

    Example:
        A notebook's progress, one tqdm bar per step::

            from tqdm import tqdm

            bars = {}

            def on_step(step: rm_qdrant.Step) -> None:
                if step.total is None:
                    print(step.label)
                    return
                bar = bars.setdefault(step.label, tqdm(total=step.total, desc=step.label))
                bar.update(step.done - bar.n)
                if step.finished:
                    bar.close()

            rm_qdrant.probe(store, "photos", on_step=on_step)
    """

    label: str
    done: int = 0
    total: int | None = None
    unit: str = ""
    finished: bool = False


OnStep = Callable[[Step], None]


def say(on_step: OnStep | None, line: str) -> None:
    """Report one uncounted line (a :class:`Step` with no total)."""
    if on_step is not None:
        on_step(Step(line))


class Counted:
    """One counted step: ``start(total)``, ``advance()`` per unit (from any thread), finished on
    leaving the ``with`` block (by an exception too) if it started."""

    def __init__(self, on_step: OnStep | None, label: str, unit: str) -> None:
        self.on_step, self.label, self.unit = on_step, label, unit
        self.done = 0
        self.total: int | None = None
        self._lock = threading.Lock()

    def start(self, total: int) -> None:
        with self._lock:
            self.done, self.total = 0, total
            self._tell()

    def advance(self, units: int = 1) -> None:
        with self._lock:
            self.done += units
            if units:
                self._tell()

    def _tell(self, finished: bool = False) -> None:
        if self.on_step is not None and self.total is not None:
            self.on_step(Step(self.label, self.done, self.total, self.unit, finished))

    def __enter__(self) -> Counted:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._lock:
            self._tell(finished=True)


def check_callback(value: object, name: str, takes: str) -> None:
    """Refuse a callback that is not callable (None is no callback)."""
    if value is not None and not callable(value):
        raise ConfigError(f"{name} is a function of {takes} (or None), not {type(value).__name__}")


def pair_source(pair: PairRecord, source: SourceConfig | None) -> SourceConfig:
    """``source``, else the settings the pair recorded (``rmq init``'s source options), else the
    defaults: what ``rmq`` uses when no source option is given."""
    if source is not None:
        if not isinstance(source, SourceConfig):
            raise ConfigError(f"source is a SourceConfig (or None), not {type(source).__name__}")
        return source
    return SourceConfig(**from_settings(pair.source or {}))


def as_encoder(model: str | os.PathLike[str] | OnnxEncoder) -> OnnxEncoder:
    """A model argument (a path, or a loaded encoder) as a loaded encoder."""
    return model if isinstance(model, OnnxEncoder) else load_encoder(model)


def image_items(data: str | os.PathLike[str] | Sequence[ImageItem]) -> list[ImageItem]:
    """Images given as a folder (``DIR/<label>/<image>``, read by
    :func:`~rm_qdrant.operations.indexing.scan_image_folder`) or as :class:`ImageItem`."""
    if isinstance(data, (str, bytes, os.PathLike)) or not isinstance(data, Sequence):
        return scan_image_folder(data)  # type: ignore[arg-type]
    return list(data)


def path_text(value: str | os.PathLike[str] | None) -> str | None:
    """A path argument as the text the lower layers take (None stays None)."""
    return None if value is None else os.fspath(value)


def store_key(store: Store) -> str | None:
    """What names ``store`` for the probe cache: as ``rmq --qdrant`` names it, a folder made
    absolute (so ``rmq status`` finds a probe run from Python, and the other way round); None for
    a store that names no location."""
    path = getattr(store, "path", None)  # the embedded store's folder
    if path is not None:
        return str(Path(path).resolve())
    location = getattr(store, "location", None)  # qdrant-client's: a URL, :memory: or a folder
    if not isinstance(location, str) or not location:
        return None
    return location if location == ":memory:" or "://" in location else str(Path(location).resolve())


def draw_with_steps(
    store: Store,
    pair: PairRecord,
    encoder: OnnxEncoder | None,
    size: int,
    *,
    seed: int,
    source: SourceConfig,
    on_step: OnStep | None,
    label: str = "re-embedding the sample",
) -> ProbeSample:
    """:func:`~rm_qdrant.evaluation.probe.draw_sample` reported as one counted step over the images,
    after a pre-flight: a few images fetched first, so settings that read none stop at once."""
    preflight(store, pair, encoder, source)
    unit = "documents" if encoder is not None and encoder.info.modality == "text" else "images"
    with Counted(on_step, label, unit) as step:
        return draw_sample(
            store, pair, encoder, size, seed=seed, source=source, on_plan=step.start, on_image=step.advance
        )


def sample_line(sample: ProbeSample, seed: int, baseline: str) -> str:
    """What a guard's verdict was judged on, so two runs can be compared: the same key, seed and
    baseline give the same verdict (the points still in old change as the backfill goes on)."""
    unread = f", {sample.failed} unreadable left out" if sample.failed else ""
    return (
        f"sample {sample.key}: {len(sample.ids)} points drawn with --seed {seed} from the {sample.gallery} "
        f"still in old{unread}; judged against {baseline}"
    )


def needs_torch(exc: ModuleNotFoundError) -> ConfigError:
    """The error for a training dependency that is missing (``fit`` trains with PyTorch); any
    other missing module is raised as it is."""
    if exc.name in ("torch", "yaml", "onnx"):
        return ConfigError(
            f"this needs {exc.name}: pip install -e '.[train,export]' (pins the CPU build, torch==2.13.0)"
        )
    raise exc
