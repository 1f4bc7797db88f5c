"""Storage cost of ``--keep-old``: what the old collection still holds after a full migration.

Migrates the same CIFAR-10 test JPEGs twice on the embedded store, once in the
default mode (migrated points leave old) and once with ``--keep-old`` (they stay,
marked and hidden, so ``rmq rollback`` is instant), and prints, for both
collections afterwards, the points and the bytes of their vectors and payloads
(read back from the store). File sizes on disk are not used: qdrant-edge
preallocates its WAL and segment files (about 130 MiB for a fresh collection).
The old model makes 64-d vectors, the new 128-d.

Run: ``python benchmarks/keep_old_storage.py [--n 10000]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convnet import convnet_encoder  # noqa: E402
from migration_throughput import cifar_test_images  # noqa: E402

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, open_store, scan_image_folder  # noqa: E402
from rm_qdrant.migration.migrate import MigrateOptions, run_migration  # noqa: E402


def stored_mib(store, collection: str) -> float:
    """Vector bytes (float32) plus payload bytes (as JSON) of every point."""
    total, offset = 0, None
    while True:
        page, offset = store.scroll(collection, limit=2000, offset=offset, with_vectors=True)
        total += sum(r.vector.nbytes + len(json.dumps(r.payload)) for r in page)
        if offset is None:
            return total / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    args = parser.parse_args()
    items = scan_image_folder(cifar_test_images())[: args.n]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rmq-keepold-") as tmp:
        folder = Path(tmp)
        old = convnet_encoder(folder / "old.onnx", heads={"embedding": ("features", 64)}, seed=1)
        new = convnet_encoder(
            folder / "new.onnx", heads={"new": ("features", 128), "rev": ("new", 64)}, seed=2
        )
        for keep_old in (False, True):
            path = folder / f"store-{keep_old}"
            with open_store(path) as store:
                index_images(store, "old", OnnxEncoder(old), items, batch_size=1000)
                before = stored_mib(store, "old")
                create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(new), keep_old=keep_old)
                run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=1000))
                counts = (store.count("old"), store.count("p-new"))
                after = (stored_mib(store, "old"), stored_mib(store, "p-new"))
            rows.append((keep_old, before, *after, counts))
    print(f"command: python {' '.join(sys.argv)}")
    print(f"{args.n} CIFAR-10 test images, old 64-d, new 128-d, embedded store\n")
    print("| mode | old before (MiB) | old after (MiB) | new after (MiB) | points old / new |")
    print("|---|--:|--:|--:|--:|")
    for keep_old, before, after, new_size, (n_old, n_new) in rows:
        mode = "--keep-old" if keep_old else "default"
        print(f"| {mode} | {before:.1f} | {after:.1f} | {new_size:.1f} | {n_old:,} / {n_new:,} |")


if __name__ == "__main__":
    main()
