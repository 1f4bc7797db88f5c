"""The library tour: every step of a backfill as a Python call, no ``rmq`` and no subprocess.

What a scheduler's task or a notebook runs instead of shelling out: the quickstart's digits
and linear ONNX models (``examples/quickstart.py`` makes them: no download, no training), then
``rm_qdrant.index``, ``init``, ``probe``, ``evaluate``, ``migrate``, ``status`` and
``finalize`` on a temporary embedded store. Each call returns a frozen report (``as_dict()``
is the matching ``rmq`` command's ``--json``) and raises ``rm_qdrant.RmqError`` subclasses.

Run: ``python examples/library.py [--out rmq-library]``
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/quickstart.py, beside this file

from quickstart import SPEC, fit_models, write_images  # noqa: E402

import rm_qdrant  # noqa: E402
from rm_qdrant_exporters.linear import linear_encoder  # noqa: E402


def on_step(step: rm_qdrant.Step) -> None:
    """Progress, one line per step: what it counted once it ends, or the line it reports."""
    if step.total is None:
        print(f"  {step.label}")
    elif step.finished:
        print(f"  {step.label}: {step.done} of {step.total} {step.unit}")


def make_models(out: Path) -> tuple[Path, Path, Path]:
    """The old model (PCA on digits 0-4), the rm graph (LDA on all digits with ψ back into the
    old space) and the plain new model (the LDA alone), as stamped ONNX graphs."""
    x, y = write_images(out / "images")
    old, new, psi = fit_models(x, y)
    old_onnx = linear_encoder(
        out / "old.onnx", [("embedding", "pixels", old)], input_spec=SPEC, name="pca-old"
    )
    rm_onnx = linear_encoder(
        out / "rm.onnx", [("new", "pixels", new), ("rev", "new", psi)], input_spec=SPEC, name="lda-rm"
    )
    new_onnx = linear_encoder(out / "new.onnx", [("embedding", "pixels", new)], input_spec=SPEC, name="lda")
    return old_onnx, rm_onnx, new_onnx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="rmq-library", help="Where the files go (replaced).")
    out = Path(parser.parse_args().out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    old, rm, new = make_models(out)
    images = rm_qdrant.scan_image_folder(out / "images")

    with rm_qdrant.open_store(out / "qdrant") as store:
        print("index: the old model fills the collection a deployment would have")
        indexed = rm_qdrant.index(store, out / "images", encoder=old, collection="gallery", on_step=on_step)
        print(f"  {indexed.indexed} images into {indexed.collection!r}, {len(indexed.failed)} skipped")

        print("init: the pair, its new collection and its models")
        created = rm_qdrant.init(
            store, "digits", old_collection="gallery", encoder=rm, old_encoder=old, new_model=new
        )
        print(f"  pair {created.pair.name!r} ({created.pair.mode}): {created.pair.new_collection!r} created")

        print("probe: the backfill forecast on a re-embedded sample, nothing written")
        probed = rm_qdrant.probe(store, "digits", sample=400, order="centroid", on_step=on_step)
        for curve in probed.forecasts:
            print(
                f"  {curve.mode:6} recall@{probed.k} area {curve.area:.3f}, dips at {curve.dips() or 'none'}"
            )
        print(f"  recommendation: {probed.advice.text}")

        print("evaluate: mAP as the pair serves it at each fraction, on a copy")
        measured = rm_qdrant.evaluate(store, "digits", images[::30], at=[0, 0.5, 1], order="centroid")
        for point in measured.points:
            print(f"  t={point.t:<4} mAP {100 * point.map:5.1f}  top-1 {100 * point.top1:5.1f}")
        gain = "-" if measured.gain_map is None else f"{measured.gain_map:.0%}"
        print(f"  AUC_mAP {100 * measured.totals['auc_map']:.1f}; the paper's Gain {gain}")

        print("migrate: half the gallery, least typical digits first")
        half = rm_qdrant.migrate(store, "digits", until=0.5, order="centroid", batch=200)
        print(f"  moved {half.moved} points in {half.seconds:.1f} s")
        now = rm_qdrant.status(store, "digits")
        print(f"  status: {now.fraction:.0%} in new, {now.status.failed} failed")
        if now.estimate is not None:  # from the probe's sample: what the merge serves now
            k = now.estimate["k"]
            print(
                f"  estimate: recall@{k} {now.estimate[f'recall@{k}']:.3f} now, "
                f"{now.estimate[f'recall@{k}_start']:.3f} at the start (label-free)"
            )
        with rm_qdrant.DualIndex.open(store, "digits") as index:  # the application searches both halves
            hits = index.search(images[7].uri, limit=3)
            print(f"  search: {[(h.source, h.payload['label']) for h in hits]}")

        print("migrate the rest, then finalize: new serves alone")
        rest = rm_qdrant.migrate(store, "digits", batch=200)
        done = rm_qdrant.finalize(store, "digits")
        pair = done.pair
        print(f"  moved {rest.moved} more; pair {pair.name!r} is {pair.state}, served as {pair.alias!r}")
        try:
            rm_qdrant.probe(store, "digits")
        except rm_qdrant.ConfigError as exc:  # every refusal is one of the library's errors
            print(f"  probe now: {exc}")
    print(f"\nfiles are in {out}")


if __name__ == "__main__":
    main()
