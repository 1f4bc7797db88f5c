"""Migration throughput against the encoder's own throughput, in one run.

Indexes CIFAR-10 test JPEGs (real files from ../shared/data) into an old
collection of the embedded store, then measures, on the same images and batch size:

- the encoder alone: ONNX Runtime over pre-decoded batches (no I/O at all);
- ``rmq migrate``'s engine: fetch + decode + encode + Qdrant writes, end to end.

The goal is a ratio of at least 0.8: image decoding and Qdrant I/O hidden behind
the model. The encoder is a small CNN with random weights (benchmarks/convnet.py).
The encoder-alone figure is the mean of a measurement before and after the
migration, to cancel drift on a shared machine.

Run: ``python benchmarks/migration_throughput.py [--n 10000] [--batch 1000]``
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cifar import cifar_root  # noqa: E402
from convnet import RESNET18_SIZE, SMALL, convnet_encoder  # noqa: E402

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, open_store, scan_image_folder  # noqa: E402
from rm_qdrant.backfill.migrate import MigrateOptions, run_migration  # noqa: E402
from rm_qdrant.backfill.ranking import prepare_order  # noqa: E402


def cifar_test_images() -> Path:
    return cifar_root() / "test"


def encoder_alone(encoder: OnnxEncoder, tensor: np.ndarray, batch: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(tensor), batch):
        encoder.run(tensor[i : i + batch], ["new"])
    return len(tensor) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="images to migrate")
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--fetch-workers", type=int, default=4)
    parser.add_argument(
        "--model",
        choices=["resnet18-size", "small"],
        default="resnet18-size",
        help="encoder cost: ResNet-18's scale (~300 M MACs/image) or a tiny CNN (~6 M)",
    )
    args = parser.parse_args()
    items = scan_image_folder(cifar_test_images())[: args.n]
    with tempfile.TemporaryDirectory(prefix="rmq-migbench-") as tmp:
        folder = Path(tmp)
        old = OnnxEncoder(convnet_encoder(folder / "old.onnx", heads={"embedding": ("features", 64)}, seed=1))
        stages = RESNET18_SIZE if args.model == "resnet18-size" else SMALL
        heads = {"new": ("features", 128), "rev": ("new", 64)}
        model_path = convnet_encoder(folder / "new.onnx", heads=heads, stages=stages, seed=2)
        store = open_store(folder / "qdrant")
        index_images(store, "old", old, items, batch_size=args.batch)
        create_pair(store, "bench", old_collection="old", encoder=OnnxEncoder(model_path))
        index = DualIndex.open(store, "bench")
        index.pair = prepare_order(store, index.pair, "random")  # `rmq migrate --prepare`: not timed
        tensor = index.encoder.preprocess([i.uri for i in items])

        before = encoder_alone(index.encoder, tensor, args.batch)
        options = MigrateOptions(batch=args.batch, fetch_workers=args.fetch_workers)
        report = run_migration(index, options)
        after = encoder_alone(index.encoder, tensor, args.batch)
        store.close()

    encoder_rate = (before + after) / 2
    migrate_rate = report.moved / report.seconds
    print(f"command: python {' '.join(sys.argv)}")
    cpu = platform.processor() or platform.machine()
    print(f"machine: {os.cpu_count()} cores, {cpu}, Python {platform.python_version()}")
    print(f"images: {report.moved} CIFAR-10 test JPEGs (32x32), batch {args.batch}, ", end="")
    print(f"fetch workers {args.fetch_workers}")
    print(f"encoder: {args.model} CNN (random weights), outputs new (128-d) and rev (64-d)\n")
    print("| figure | points/s |")
    print("|---|--:|")
    print(f"| encoder alone (pre-decoded; before / after) | {encoder_rate:,.0f} ", end="")
    print(f"({before:,.0f} / {after:,.0f}) |")
    print(f"| migration end to end (embedded store) | {migrate_rate:,.0f} |")
    print(f"| **ratio** | **{migrate_rate / encoder_rate:.2f}** |")
    print(f"\nmoved {report.moved}, failed {report.failed}; migration took {report.seconds:.1f} s")
    print("(the backfill order was ranked beforehand, as `rmq migrate --prepare` does, untimed)")


if __name__ == "__main__":
    main()
