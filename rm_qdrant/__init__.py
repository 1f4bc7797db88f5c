"""rm-qdrant: online backfilling for Qdrant by distance rank merge.

The gallery migrates from an old collection to a new one while every query
searches both and the hits are merged by distance.
"""

from __future__ import annotations

from rm_qdrant.api import (
    CalibrationReport,
    EvalReport,
    FinalizeReport,
    FitReport,
    IndexSummary,
    InitReport,
    PlanReport,
    ProbeReport,
    StatusReport,
    Step,
    SwitchReport,
    calibrate,
    clear_calibration,
    evaluate,
    failures,
    finalize,
    fit,
    index,
    init,
    migrate,
    optimize,
    plan,
    probe,
    rollback,
    set_rerank,
    status,
    switch_encoder,
)
from rm_qdrant.core.merge import Hit, merge, score_to_distance
from rm_qdrant.core.modelinfo import InputSpec, ModelInfo
from rm_qdrant.core.rerank import Rerank
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
    TextError,
    TooLarge,
    Unresolvable,
    Unsupported,
)
from rm_qdrant.evaluation.queries import TextQuery
from rm_qdrant.migration.ray_engine import RayOptions
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.models.text import TextEncoder, load_encoder
from rm_qdrant.monitoring import SearchMetrics
from rm_qdrant.operations.create import create_pair
from rm_qdrant.operations.drop import Dropped, drop_pair
from rm_qdrant.operations.failures import FailedPoint
from rm_qdrant.operations.indexing import ImageItem, IndexReport, index_images, scan_image_folder
from rm_qdrant.pair.control import Paused, pause, resume
from rm_qdrant.pair.outcome import BatchResult, MigrateOptions, MigrationReport
from rm_qdrant.pair.record import PairRecord, list_pairs, load_pair
from rm_qdrant.serving.async_dual import AsyncDualIndex
from rm_qdrant.serving.demand import DemandLog
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.serving.pair_points import PairPoint
from rm_qdrant.serving.status import PairStatus, pair_status
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store, open_store

__version__ = "0.1.0"

__all__ = [
    "AddressRefused",
    "AsyncDualIndex",
    "BatchResult",
    "CalibrationReport",
    "CollectionNotFound",
    "ConfigError",
    "DemandLog",
    "DimensionMismatch",
    "Dropped",
    "DualIndex",
    "EncoderError",
    "EvalReport",
    "ExportError",
    "FailedPoint",
    "FinalizeReport",
    "FitReport",
    "Hit",
    "ImageError",
    "ImageItem",
    "IndexReport",
    "IndexSummary",
    "InitReport",
    "InputSpec",
    "InvalidFilter",
    "InvalidPayload",
    "InvalidPointId",
    "MigrateOptions",
    "MigrationError",
    "MigrationReport",
    "ModelInfo",
    "OnnxEncoder",
    "TextEncoder",
    "TextQuery",
    "load_encoder",
    "PairPoint",
    "PairRecord",
    "PairStatus",
    "Rerank",
    "Paused",
    "PlanReport",
    "ProbeReport",
    "RayOptions",
    "Refused",
    "RmqError",
    "SearchMetrics",
    "SourceConfig",
    "SourceError",
    "StatusReport",
    "Step",
    "Store",
    "StoreError",
    "StoreLocked",
    "SwitchReport",
    "TextError",
    "TooLarge",
    "Unresolvable",
    "Unsupported",
    "calibrate",
    "clear_calibration",
    "create_pair",
    "drop_pair",
    "evaluate",
    "failures",
    "finalize",
    "fit",
    "index",
    "index_images",
    "init",
    "list_pairs",
    "load_pair",
    "merge",
    "migrate",
    "open_store",
    "optimize",
    "pause",
    "pair_status",
    "plan",
    "probe",
    "resume",
    "rollback",
    "scan_image_folder",
    "score_to_distance",
    "status",
    "set_rerank",
    "switch_encoder",
]
