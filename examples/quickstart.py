"""Quickstart: a pair of collections on the embedded store, searched as one.

Until ``rmq demo`` (trained backbones, migration) lands, this shows the serving
path end to end on real images with no download: scikit-learn's bundled
handwritten digits are written out as PNG files, two linear encoders are fitted
with numpy and exported as real ONNX graphs (an "old" PCA model fitted on digits
0-4 only, and a "new" LDA model on all digits with a least-squares ψ back into
the old space), the gallery is indexed with the old model through ``rmq index``,
the pair is created with ``rmq init``, ``rmq migrate --until 0.5`` moves half the
gallery into the new collection (least typical digits first), and queries search
both halves through ``DualIndex``.

Run: ``python examples/quickstart.py [--out rmq-quickstart]``
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

from rm_qdrant import DualIndex, InputSpec, open_store, scan_image_folder
from rm_qdrant_exporters.linear import linear_encoder

SPEC = InputSpec(height=8, width=8, channels=1)


def write_images(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    digits = load_digits()
    pixels = np.clip(digits.images * 16, 0, 255).astype(np.uint8)
    for i, (image, label) in enumerate(zip(pixels, digits.target, strict=True)):
        target = folder / str(label) / f"{i:04d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, mode="L").save(target)
    return pixels.reshape(len(pixels), -1) / 255.0, digits.target


def fit_models(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Old: PCA on digits 0-4. New: LDA on all digits. ψ: least squares new -> old."""
    seen = x[y < 5]
    old = np.linalg.svd(seen - seen.mean(0), full_matrices=False)[2][:16].T
    means = np.stack([x[y == c].mean(0) for c in range(10)])
    within = sum(np.cov(x[y == c].T) for c in range(10)) + 1e-2 * np.eye(x.shape[1])
    between = np.cov(means.T)
    values, vectors = np.linalg.eig(np.linalg.solve(within, between))
    new = np.real(vectors[:, np.argsort(-np.real(values))[:9]])
    psi = np.linalg.lstsq(x @ new, x @ old, rcond=None)[0]
    return old, new, psi


def rmq(store: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "rm_qdrant", "--qdrant", str(store), *args]
    print("$ rmq", " ".join(args))
    subprocess.run(cmd, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="rmq-quickstart", help="Where the files go (replaced).")
    out = Path(parser.parse_args().out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    x, y = write_images(out / "images")
    old, new, psi = fit_models(x, y)
    linear_encoder(out / "old.onnx", [("embedding", "pixels", old)], input_spec=SPEC, name="digits-pca-old")
    linear_encoder(
        out / "model.onnx",
        [("new", "pixels", new), ("rev", "new", psi)],
        input_spec=SPEC,
        name="digits-lda-new",
    )
    store_path = out / "qdrant"
    rmq(
        store_path,
        "index",
        "--collection",
        "digits",
        "--data",
        str(out / "images"),
        "--encoder",
        str(out / "old.onnx"),
    )
    rmq(
        store_path,
        "init",
        "--name",
        "digits",
        "--old-collection",
        "digits",
        "--encoder",
        str(out / "model.onnx"),
    )

    rmq(store_path, "migrate", "--name", "digits", "--until", "0.5", "--order", "centroid", "--batch", "200")

    items = scan_image_folder(out / "images")
    with open_store(store_path) as store, DualIndex.open(store, "digits", exact=True) as index:
        print(f"\n{index.progress():.0%} of {len(items)} images are in the new collection")
        correct = 0
        queries = items[1::50]
        for item in queries:
            hits = index.search(item.uri, limit=6)[1:]  # the first hit is the query itself
            correct += sum(h.payload["label"] == item.label for h in hits)
        print(
            f"precision@5 over {len(queries)} queries, both halves merged: {correct / (5 * len(queries)):.3f}"
        )
        query = items[7]
        print(f"\nhits for {query.uri} (label {query.label}):")
        for hit in index.search(query.uri, limit=5):
            print(
                f"  {hit.distance:.4f}  {hit.source:3}  label {hit.payload['label']}  "
                f"{Path(hit.payload['uri']).name}"
            )
    rmq(store_path, "status", "--name", "digits")
    cmd = f"{shutil.which('rmq') or Path(sys.executable).parent / 'rmq'} --qdrant {store_path}"
    print(f"\nfiles are in {out}. Try:\n  {cmd} search --name digits {query.uri}")
    print(f"  {cmd} migrate --name digits     # finish the backfill\n  {cmd} finalize --name digits")


if __name__ == "__main__":
    main()
