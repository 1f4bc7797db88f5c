"""The library's one-call entry points: one function per ``rmq`` command, for code that would
otherwise shell out (a scheduler's task, a notebook).

Each takes an open :class:`~rm_qdrant.store.Store` and keyword arguments named after the
command's options, returns a frozen report (``as_dict()`` is the command's ``--json``), never
prints, and raises the :mod:`rm_qdrant.errors` the command turns into its one error line.
Long calls report progress to an ``on_step`` callback (:class:`Step`).

========================  ==========================================================
``rmq index``             :func:`index`
``rmq init``              :func:`init`
``rmq probe``             :func:`probe`
``rmq plan``              :func:`plan`
``rmq calibrate``         :func:`calibrate` (``--clear``: :func:`clear_calibration`)
``rmq fit``               :func:`fit` (needs PyTorch, imported when it runs)
``rmq migrate``           :func:`migrate` (and :func:`optimize`)
``rmq status``            :func:`status`
``rmq eval``              :func:`evaluate`
``rmq failures``          :func:`failures`
``rmq switch-encoder``    :func:`switch_encoder` (``--rerank``: :func:`set_rerank`)
``rmq finalize``          :func:`finalize`
``rmq rollback``          :func:`rollback`
========================  ==========================================================

``rmq search``, ``pairs`` and ``drop-pair`` were library calls already:
:meth:`DualIndex.search <rm_qdrant.DualIndex.search>`, :func:`~rm_qdrant.list_pairs` and
:func:`~rm_qdrant.drop_pair`. ``rmq model`` (ONNX files, not a pair) and the training commands
(``train``, ``export``, ``demo``: ``rm_qdrant_train``'s own library) stay command-line only.
"""

from __future__ import annotations

from rm_qdrant.api.calibrating import CalibrationReport, calibrate, clear_calibration
from rm_qdrant.api.common import Step
from rm_qdrant.api.creating import IndexSummary, InitReport, index, init
from rm_qdrant.api.evaluating import EvalReport, evaluate
from rm_qdrant.api.fitting import FitReport, fit
from rm_qdrant.api.inspecting import StatusReport, failures, status
from rm_qdrant.api.lifecycle import (
    FinalizeReport,
    SwitchReport,
    finalize,
    rollback,
    set_rerank,
    switch_encoder,
)
from rm_qdrant.api.migrating import MIGRATE_OPTIONS, migrate, optimize
from rm_qdrant.api.plan_report import PlanReport
from rm_qdrant.api.planning import plan
from rm_qdrant.api.probing import ProbeReport, probe

__all__ = [
    "MIGRATE_OPTIONS",
    "CalibrationReport",
    "EvalReport",
    "FinalizeReport",
    "FitReport",
    "IndexSummary",
    "InitReport",
    "PlanReport",
    "ProbeReport",
    "StatusReport",
    "Step",
    "SwitchReport",
    "calibrate",
    "clear_calibration",
    "evaluate",
    "failures",
    "finalize",
    "fit",
    "index",
    "init",
    "migrate",
    "optimize",
    "plan",
    "probe",
    "rollback",
    "status",
    "set_rerank",
    "switch_encoder",
]
