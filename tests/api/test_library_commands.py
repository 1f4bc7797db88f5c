"""Each ``rmq`` command as one Python call (issue 40): the report a function returns is what the
command's ``--json`` prints for the same store, and bad input raises the library's error (never
SystemExit, never a print).

Commands that write run on twin stores, built the same way: the function on one, ``rmq`` on
the other. Commands that only read run on the same store, the function first.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import rm_qdrant
from rm_qdrant import open_store
from rm_qdrant.cli import cli
from rm_qdrant.errors import CollectionNotFound, ConfigError, MigrationError, Refused
from tests.conftest import make_image_folder


def rmq(folder: Path, *args: object, status: int = 0) -> dict:
    """``rmq --qdrant FOLDER ARGS --json``, in this process: its JSON report (exit ``status``)."""
    result = CliRunner().invoke(cli, ["--qdrant", str(folder), *map(str, args), "--json"])
    assert result.exit_code == status, result.output
    return json.loads(result.stdout)


def as_json(data: object) -> object:
    """A report as ``rmq --json`` writes it: through JSON (tuples as lists, paths as text)."""
    return json.loads(json.dumps(data, default=str))


def twin(folder: Path, models, images: Path, *, keep_old: bool = False, naive: bool = False) -> Path:
    """A store at ``folder`` with the images indexed as ``gallery`` by the old model and the pair
    ``p`` on it (rm, or naive), recording the old model."""
    with open_store(folder) as store:
        rm_qdrant.index(store, images, encoder=models.old, collection="gallery")
        rm_qdrant.init(
            store,
            "p",
            old_collection="gallery",
            encoder=models.new_only if naive else models.rm,
            old_encoder=models.old,
            keep_old=keep_old,
        )
    return folder


@pytest.fixture
def images(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "images")


def test_index_and_init_report_what_rmq_prints(tmp_path, models, images):
    with open_store(tmp_path / "lib") as store:
        indexed = rm_qdrant.index(store, images, encoder=models.old, collection="gallery")
        created = rm_qdrant.init(store, "p", old_collection="gallery", encoder=models.rm, label_field="label")
    cli_store = tmp_path / "cli"
    assert as_json(indexed.as_dict()) == rmq(
        cli_store, "index", "--collection", "gallery", "--data", images, "--encoder", models.old
    )
    assert (indexed.collection, indexed.indexed, indexed.failed) == ("gallery", 24, [])
    printed = rmq(cli_store, "init", "--name", "p", "--old-collection", "gallery", "--encoder", models.rm)
    assert as_json(created.as_dict()) == printed
    assert isinstance(created.pair, rm_qdrant.PairRecord) and created.pair.mode == "rm" and created.note == ""


def test_probe_then_status_report_what_rmq_prints_and_share_the_probe_cache(tmp_path, models, images):
    folder = twin(tmp_path / "q", models, images)
    steps: list[rm_qdrant.Step] = []
    with open_store(folder) as store:
        probed = rm_qdrant.probe(store, "p", sample=12, k=3, on_step=steps.append)
    assert as_json(probed.as_dict()) == rmq(folder, "probe", "--name", "p", "--sample", 12, "--k", 3)
    assert [f.mode for f in probed.forecasts] == ["no-psi", "rm"] and probed.sample == 12
    assert Path(probed.cache or "").is_file()
    counted = [s for s in steps if s.total is not None]
    assert counted[0] == rm_qdrant.Step("re-embedding the sample", 0, 12, "images")
    assert (
        counted[-1].finished and counted[-1].done == 12 and all(s.label == counted[0].label for s in counted)
    )
    with open_store(folder) as store:
        status = rm_qdrant.status(store, "p")
    assert as_json(status.as_dict()) == rmq(folder, "status", "--name", "p")
    assert status.estimate is not None and status.estimate["sample"] == 12  # the probe rmq status reads
    assert (status.fraction, status.status.old_count, status.calibrated) == (0.0, 24, False)


def test_evaluate_reports_what_rmq_eval_prints_and_leaves_the_pair(tmp_path, models, images):
    folder = twin(tmp_path / "q", models, images)
    seen, copied = [], []
    with open_store(folder) as store:
        report = rm_qdrant.evaluate(
            store,
            "p",
            images,
            at=[1, 0],
            new_model=models.new_only,
            on_point=lambda curve, point: seen.append((curve, point.t)),
            on_copied=lambda: copied.append(True),
        )
        assert store.count("p-new") == 0  # measured on a copy
    printed = rmq(
        folder, "eval", "--name", "p", "--queries", images, "--at", "0,1", "--new-model", models.new_only
    )
    assert as_json(report.as_dict()) == printed
    assert [p.t for p in report.points] == [0.0, 1.0] and report.auc_map is not None
    assert report.naive is not None and report.gain_map == printed["gain_map"]
    assert seen == [("naive", 0.0), ("naive", 1.0), ("pair", 0.0), ("pair", 1.0)] and copied == [True]


def test_calibrate_and_clear_calibration_do_what_rmq_calibrate_does(tmp_path, models, images):
    lib = twin(tmp_path / "lib", models, images, naive=True)
    shell = twin(tmp_path / "cli", models, images, naive=True)
    options = {"sample": 24, "k": 3, "holdout": 0.5, "force": True}
    with open_store(lib) as store:
        report = rm_qdrant.calibrate(store, "p", **options)
        assert rm_qdrant.load_pair(store, "p").calibration is not None
    printed = rmq(shell, "calibrate", "--name", "p", "--sample", 24, "--k", 3, "--holdout", 0.5, "--force")
    assert as_json(report.as_dict()) == printed and report.kept
    with open_store(lib) as store:
        assert rm_qdrant.clear_calibration(store, "p").calibration is None
        assert rm_qdrant.load_pair(store, "p").calibration is None


def test_migrate_finalize_and_rollback_report_what_rmq_prints(tmp_path, models, images):
    lib = twin(tmp_path / "lib", models, images, keep_old=True)
    shell = twin(tmp_path / "cli", models, images, keep_old=True)
    with open_store(lib) as store:
        rm_qdrant.migrate(store, "p")
        finalized = rm_qdrant.finalize(store, "p", alias="live")
    rmq(shell, "migrate", "--name", "p")
    assert as_json(finalized.as_dict()) == rmq(shell, "finalize", "--name", "p", "--alias", "live")
    assert finalized.pair.state == "finalized" and finalized.dropped is None
    with open_store(lib) as store:
        rolled = rm_qdrant.rollback(store, "p")
    assert as_json(dataclasses.asdict(rolled)) == rmq(shell, "rollback", "--name", "p")
    assert rolled.state == "rolled_back"


def test_failures_and_finalize_dropping_them_report_what_rmq_prints(tmp_path, models, images):
    lib = twin(tmp_path / "lib", models, images)
    shell = twin(tmp_path / "cli", models, images)
    for gone in sorted(images.rglob("*.png"))[:2]:  # two images no migration can read
        gone.unlink()
    with open_store(lib) as store:
        rm_qdrant.migrate(store, "p", max_failure_share=1.0)
        failed = list(rm_qdrant.failures(store, "p"))
        finalized = rm_qdrant.finalize(store, "p", drop_failed=True, out=tmp_path / "lib.jsonl")
    rmq(shell, "migrate", "--name", "p", "--max-failures", 1)
    printed = rmq(shell, "failures", "--name", "p")
    assert printed["failed"] == len(failed) == 2
    assert [f["id"] for f in printed["points"]] == [f.id for f in failed]
    dropped = rmq(shell, "finalize", "--name", "p", "--drop-failed", "--out", tmp_path / "cli.jsonl")
    assert as_json(finalized.as_dict()) == {**dropped, "failures_list": str(tmp_path / "lib.jsonl")}
    assert finalized.dropped is not None and finalized.dropped.removed == 2


def test_switch_encoder_reports_what_rmq_prints(tmp_path, models, images):
    lib = twin(tmp_path / "lib", models, images, naive=True)
    shell = twin(tmp_path / "cli", models, images, naive=True)
    with open_store(lib) as store:
        rm_qdrant.migrate(store, "p", until=0.5)
        switched = rm_qdrant.switch_encoder(store, "p", models.rm)
    rmq(shell, "migrate", "--name", "p", "--until", 0.5)
    assert as_json(switched.as_dict()) == rmq(shell, "switch-encoder", "--name", "p", "--encoder", models.rm)
    assert (switched.previous.mode, switched.pair.mode) == ("naive", "rm") and switched.check is not None


@pytest.fixture
def torch_threads():
    """fit sets this process's torch threads: put them back."""
    torch = pytest.importorskip("torch", reason="fit needs the train extra")
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


FIT = {"sample": 24, "holdout": 0.5, "k": 3}


def test_fit_writes_the_graph_and_reports_what_rmq_fit_prints(tmp_path, models, images, torch_threads):
    lib = twin(tmp_path / "lib", models, images)
    shell = twin(tmp_path / "cli", models, images)
    steps: list[rm_qdrant.Step] = []
    with open_store(lib) as store:
        report = rm_qdrant.fit(
            store, "p", backbone=models.new_only, out=tmp_path / "lib.onnx", loss="procrustes", force=True,
            on_step=steps.append, **FIT,
        )  # fmt: skip
    printed = rmq(
        shell, "fit", "--name", "p", "--backbone", models.new_only, "--out", tmp_path / "cli.onnx",
        "--loss", "procrustes", "--force", "--sample", 24, "--holdout", 0.5, "--k", 3,
    )  # fmt: skip
    timing = ("train_seconds", "seconds", "out")
    mine = {k: v for k, v in as_json(report.as_dict()).items() if k not in timing}
    assert mine == {k: v for k, v in printed.items() if k not in timing}
    assert report.out == str(tmp_path / "lib.onnx") and Path(report.out).is_file() and report.parity < 1e-4
    lines = [s.label for s in steps if s.total is None]
    assert lines[0] == "training procrustes on 12 pairs (12 held out)..." and lines[1].startswith(
        "torch threads"
    )


def test_a_fit_worse_than_naive_raises_refused_with_its_report_and_writes_nothing(
    tmp_path, models, images, torch_threads
):
    lib = twin(tmp_path / "lib", models, images)
    shell = twin(tmp_path / "cli", models, images)
    bad = {"loss": "rqt", "steps": 1, "lr": 1e-9}  # ψ left at its random start
    with open_store(lib) as store, pytest.raises(Refused, match="not written to") as refused:
        rm_qdrant.fit(store, "p", backbone=models.new_only, out=tmp_path / "lib.onnx", **bad, **FIT)
    report = refused.value.report
    assert isinstance(report, rm_qdrant.FitReport) and report.out is None and report.instead
    assert not (tmp_path / "lib.onnx").exists()
    printed = rmq(
        shell, "fit", "--name", "p", "--backbone", models.new_only, "--out", tmp_path / "cli.onnx",
        "--loss", "rqt", "--steps", 1, "--lr", 1e-9, "--sample", 24, "--holdout", 0.5, "--k", 3, status=3,
    )  # fmt: skip
    mine = as_json(report.as_dict())
    assert {k: v for k, v in mine.items() if k != "train_seconds"} == {
        k: v for k, v in printed.items() if k != "train_seconds"
    }
    with open_store(lib) as store, pytest.raises(ConfigError, match="the backbone itself"):
        rm_qdrant.fit(store, "p", backbone=models.new_only, out=models.new_only, **FIT)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda s, m, i: rm_qdrant.status(s, "nope"), CollectionNotFound, "no pair named 'nope'"),
        (lambda s, m, i: rm_qdrant.probe(s, "nope"), CollectionNotFound, "no pair named 'nope'"),
        (lambda s, m, i: rm_qdrant.probe(s, "p", sample=1), ConfigError, "sample is a whole number >= 2"),
        (
            lambda s, m, i: rm_qdrant.index(s, i, encoder=m.old, name="p", collection="c"),
            ConfigError,
            "exactly one of",
        ),
        (
            lambda s, m, i: rm_qdrant.init(
                s, "q", old_collection="gallery", encoder=m.rm, uri_field="u", uri_template="{id}"
            ),
            ConfigError,
            "not both",
        ),
        (lambda s, m, i: rm_qdrant.init(s, "q", encoder=m.rm, mode="sideways"), ConfigError, "mode is"),
        (lambda s, m, i: rm_qdrant.evaluate(s, "p", i, at="half"), ConfigError, "bad --at 'half'"),
        (lambda s, m, i: rm_qdrant.evaluate(s, "p", i, at=[0, 2]), ConfigError, "fractions lie in"),
        (lambda s, m, i: rm_qdrant.calibrate(s, "p", sample=8), ConfigError, "in rm mode"),
        (lambda s, m, i: rm_qdrant.finalize(s, "p", out="x.jsonl"), ConfigError, "--drop-failed"),
        (lambda s, m, i: rm_qdrant.finalize(s, "p"), MigrationError, "still serve from 'gallery'"),
        (lambda s, m, i: rm_qdrant.rollback(s, "p"), MigrationError, "keep"),
        (lambda s, m, i: rm_qdrant.switch_encoder(s, "p", m.old), ConfigError, "6-d"),
        (lambda s, m, i: rm_qdrant.evaluate(s, "p", i, on_point=5), ConfigError, "on_point is a function"),
    ],
)
def test_bad_input_raises_the_documented_error(tmp_path, models, images, call, error, message):
    folder = twin(tmp_path / "q", models, images)
    with open_store(folder) as store:
        with pytest.raises(error, match=message) as raised:
            call(store, models, images)
        assert store.count("p-new") == 0  # nothing moved
    assert not isinstance(raised.value, SystemExit)


def test_a_library_call_prints_nothing(tmp_path, models, images, capsys):
    folder = twin(tmp_path / "q", models, images)
    with open_store(folder) as store:
        rm_qdrant.probe(store, "p", sample=8, k=3)
        rm_qdrant.status(store, "p")
    assert capsys.readouterr() == ("", "")
