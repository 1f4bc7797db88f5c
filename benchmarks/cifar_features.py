"""Real embeddings for the search and scale benchmarks: CIFAR-10 through the project's small CNNs.

The graphs are those of ``python benchmarks/fit_table.py --data cifar --epochs 8
--new-epochs 5`` (cached under ``.cache/fit-bench``; that command is run here when they
are missing, about half an hour on 2 cores): the old small CNN (5 classes, 128-d
``embedding``) and the new one with the trainer's MCL heads (``new`` and ``rev``, 128-d).
All 60,000 images (train, then test) are embedded once and cached in
``.cache/bench-features/cifar-small-cnn.npz``.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cifar import ROOT, cifar_root  # noqa: E402
from rm_qdrant import OnnxEncoder, scan_image_folder  # noqa: E402

FIT_RUN = ["--data", "cifar", "--epochs", "8", "--new-epochs", "5"]
GRAPHS = ROOT / ".cache" / "fit-bench" / "cifar-small-cnn-128-e8-5" / "onnx"
CACHE = ROOT / ".cache" / "bench-features" / "cifar-small-cnn.npz"


@dataclass(frozen=True)
class Features:
    """Row i of every array is image ``uris[i]``."""

    uris: list[str]
    labels: np.ndarray
    old: np.ndarray  # the old model's embedding (what an old collection stores)
    new: np.ndarray  # the new model's gallery vector (what new stores)
    rev: np.ndarray  # ψ: the new model's query as the old model would embed it


def graphs() -> tuple[Path, Path]:
    """(old model, new model with heads), built by fit_table.py if missing."""
    old, rm = GRAPHS / "old.onnx", GRAPHS / "trainer.onnx"
    if not (old.is_file() and rm.is_file()):
        print("building the CIFAR small-CNN graphs with benchmarks/fit_table.py (long)...", flush=True)
        script = Path(__file__).with_name("fit_table.py")
        subprocess.run([sys.executable, str(script), *FIT_RUN], check=True)
    return old, rm


OLD_CACHE = ROOT / ".cache" / "bench-features" / "cifar-old-small-cnn.npz"


def old_features() -> tuple[list[str], np.ndarray]:
    """The 60,000 CIFAR-10 images (train, then test) through the old small CNN alone (128-d
    ``embedding``): real trained-CNN embeddings for what needs only one model. Its checkpoint is
    the one fit_table.py trains first (``rmq train backbone --role old``, trained here when
    missing: about 20 minutes on 2 idle cores), exported with ``rmq export --out-old``."""
    if not OLD_CACHE.is_file():
        checkpoint = GRAPHS.parent / "runs" / "old.pt"
        if not checkpoint.is_file():
            print("training the old CIFAR small CNN (rmq train backbone, long)...", flush=True)
            from benchmarks.cifar import cifar_root as data

            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "rm_qdrant",
                    "train",
                    "backbone",
                    "-q",
                    "--data",
                    str(data()),
                    "--role",
                    "old",
                    "--arch",
                    "small-cnn",
                    "--epochs",
                    "8",
                    "--out",
                    str(checkpoint),
                ],
                check=True,
            )
        graph = OLD_CACHE.with_name("cifar-old-small-cnn.onnx")
        graph.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "rm_qdrant",
                "export",
                "--old",
                str(checkpoint),
                "--out-old",
                str(graph),
                "--no-scores",
            ],
            check=True,
        )
        root = cifar_root()
        uris = [item.uri for item in scan_image_folder(root / "train") + scan_image_folder(root / "test")]
        print(f"embedding {len(uris):,} CIFAR-10 images with the old small CNN...", flush=True)
        np.savez(OLD_CACHE, uris=np.array(uris), old=_embed(graph, uris, ["embedding"])["embedding"])
    data = np.load(OLD_CACHE)
    return [str(u) for u in data["uris"]], data["old"]


def _embed(model: Path, uris: list[str], outputs: list[str]) -> dict[str, np.ndarray]:
    encoder = OnnxEncoder(model, batch_size=512)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in outputs}
    for start in range(0, len(uris), 4096):
        for name, value in encoder.encode(uris[start : start + 4096], outputs).items():
            parts[name].append(value)
    return {name: np.concatenate(value) for name, value in parts.items()}


def cifar_features() -> Features:
    """The 60,000 CIFAR-10 images' vectors, embedded on first use and cached."""
    if not CACHE.is_file():
        root = cifar_root()
        items = scan_image_folder(root / "train") + scan_image_folder(root / "test")
        uris = [item.uri for item in items]
        old, rm = graphs()
        print(f"embedding {len(uris):,} CIFAR-10 images with the old and new small CNNs...", flush=True)
        vectors = {**_embed(old, uris, ["embedding"]), **_embed(rm, uris, ["new", "rev"])}
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        labels = np.array([item.label for item in items])
        np.savez(CACHE, uris=np.array(uris), labels=labels, old=vectors["embedding"], **vectors)
    data = np.load(CACHE)
    return Features([str(u) for u in data["uris"]], data["labels"], data["old"], data["new"], data["rev"])


if __name__ == "__main__":
    features = cifar_features()
    print(f"{len(features.uris):,} images: old {features.old.shape}, new {features.new.shape}")
