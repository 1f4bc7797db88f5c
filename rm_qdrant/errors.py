"""The library's exceptions: one base class, one subclass per kind of fault."""

from __future__ import annotations


class RmqError(Exception):
    """Base class of every error rm-qdrant raises on purpose."""


class ConfigError(RmqError):
    """Bad configuration: a malformed option, a pair that does not fit its models."""


class Refused(ConfigError):
    """A measured check said no: the command ran as asked and kept nothing (``rmq`` exits 3).

    Attributes:
        measured: what the check measured (a dataclass), for a report of the refusal.
        report: the refused call's whole report, where it has one (:func:`rm_qdrant.fit`'s
            :class:`~rm_qdrant.api.fitting.FitReport`, :func:`rm_qdrant.calibrate`'s
            :class:`~rm_qdrant.api.calibrating.CalibrationReport`); None otherwise.
    """

    def __init__(self, message: str, *, measured: object | None = None, report: object | None = None) -> None:
        super().__init__(message)
        self.measured = measured
        self.report = report


class StoreError(RmqError):
    """Qdrant could not be reached or refused an operation."""


class CollectionNotFound(StoreError):
    """A named collection (or pair record) does not exist."""


class Unsupported(StoreError):
    """The Qdrant server lacks a feature a call needs (an older version)."""


class StoreLocked(StoreError):
    """An embedded store is already open in another process."""


class DimensionMismatch(ConfigError):
    """A vector's size does not match the collection or model it is meant for."""


class EncoderError(RmqError):
    """An ONNX encoder is missing, malformed or lacks the outputs/metadata needed."""


class ImageError(RmqError):
    """An image could not be read or decoded."""


class TextError(ImageError):
    """A document's or query's text cannot be read: not text, empty, or too large."""


class TooLarge(ImageError):
    """An image is over the pixel limit (``--max-pixels``)."""


class SourceError(RmqError):
    """A point's source image could not be fetched (bad URI, missing file, HTTP error)."""


class AddressRefused(SourceError):
    """A fetch was refused because of where it would connect (a private or metadata address)."""


class Unresolvable(SourceError):
    """A host name did not resolve (worth another attempt: DNS fails transiently)."""


class ExportError(RmqError):
    """An export that cannot be done, or whose graph does not match PyTorch."""


class MigrationError(RmqError):
    """A migration cannot start or go on (bad state, too many failures, refused cutover)."""


class InvalidPayload(ConfigError):
    """A payload no store holds as given (see :mod:`rm_qdrant.store.bounds`): too deep or too
    large, a key that is not a string, a value JSON has no room for. Nothing was written."""


class InvalidFilter(ConfigError):
    """A filter a Qdrant server would refuse (see :mod:`rm_qdrant.store.bounds`): nested too deep,
    a condition with nothing to match, a value no payload holds. Nothing was read or written."""


class InvalidPointId(ConfigError):
    """A point id that is neither an unsigned 64-bit integer nor a UUID."""
