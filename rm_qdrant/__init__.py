"""rm-qdrant: online backfilling for Qdrant by distance rank merge.

The gallery migrates from an old collection to a new one while every query
searches both and the hits are merged by distance.
"""

from __future__ import annotations

from rm_qdrant.api import migrate, optimize
from rm_qdrant.core.merge import Hit, merge, score_to_distance
from rm_qdrant.core.modelinfo import InputSpec, ModelInfo
from rm_qdrant.errors import (
    AddressRefused,
    CollectionNotFound,
    ConfigError,
    DimensionMismatch,
    EncoderError,
    ExportError,
    ImageError,
    InvalidFilter,
    InvalidPayload,
    InvalidPointId,
    MigrationError,
    Refused,
    RmqError,
    SourceError,
    StoreError,
    StoreLocked,
    TooLarge,
    Unresolvable,
    Unsupported,
)
from rm_qdrant.migration.ray_engine import RayOptions
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.operations.create import create_pair
from rm_qdrant.operations.indexing import ImageItem, IndexReport, index_images, scan_image_folder
from rm_qdrant.pair.outcome import BatchResult, MigrateOptions, MigrationReport
from rm_qdrant.pair.record import PairRecord, load_pair
from rm_qdrant.serving.async_dual import AsyncDualIndex
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.serving.pair_points import PairPoint
from rm_qdrant.serving.status import PairStatus, pair_status
from rm_qdrant.store import Store, open_store

__version__ = "0.1.0"

__all__ = [
    "AddressRefused",
    "AsyncDualIndex",
    "BatchResult",
    "CollectionNotFound",
    "ConfigError",
    "DimensionMismatch",
    "DualIndex",
    "EncoderError",
    "ExportError",
    "Hit",
    "ImageError",
    "ImageItem",
    "IndexReport",
    "InputSpec",
    "InvalidFilter",
    "InvalidPayload",
    "InvalidPointId",
    "MigrateOptions",
    "MigrationError",
    "MigrationReport",
    "ModelInfo",
    "OnnxEncoder",
    "PairPoint",
    "PairRecord",
    "PairStatus",
    "RayOptions",
    "Refused",
    "RmqError",
    "SourceError",
    "Store",
    "StoreError",
    "StoreLocked",
    "TooLarge",
    "Unresolvable",
    "Unsupported",
    "create_pair",
    "index_images",
    "load_pair",
    "merge",
    "migrate",
    "open_store",
    "optimize",
    "pair_status",
    "scan_image_folder",
    "score_to_distance",
]
