"""What a migration's settle step costs a point, in CPU time, with an encoder that does nothing.

    python benchmarks/settle_cost.py [--layout paired|single-collection] [--n 10000] [--runs 3]

Indexes ``--n`` CIFAR-10 JPEGs into an old collection of the embedded store, then migrates a
fresh copy of it ``--runs`` times with migration_throughput.py's ``stage_costs`` (the stages one
after another, on one thread each) and prints each stage's wall time a point and the settle
step's CPU time a point (``time.thread_time`` of the thread that runs it). CPU time is what a
shared machine's load inflates least, so two checkouts compare best by it: run this file of each
(``ROOT=/path/to/other/checkout python benchmarks/settle_cost.py``), in turn.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.environ.get("ROOT") or str(Path(__file__).resolve().parents[1]))
from benchmarks import migration_throughput as bench  # noqa: E402
from benchmarks.cifar import cifar_root  # noqa: E402
from benchmarks.convnet import NULL, convnet_encoder  # noqa: E402
from rm_qdrant import OnnxEncoder, index_images, open_store, scan_image_folder  # noqa: E402


class _Clocks:
    """Stands in for ``time`` in stage_costs: wall time, and the settle thread's CPU time."""

    def __init__(self) -> None:
        self.cpu: list[float] = []

    def perf_counter(self) -> float:
        self.cpu.append(time.thread_time())
        return time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=["paired", "single-collection"], default="paired")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    items = scan_image_folder(cifar_root() / "train")[: args.n]
    with tempfile.TemporaryDirectory(prefix="rmq-settle-") as tmp:
        folder = Path(tmp)
        old = OnnxEncoder(convnet_encoder(folder / "old.onnx", heads={"embedding": ("features", 64)}, seed=1))
        store = open_store(folder / "qdrant")
        index_images(store, "gallery", old, items, batch_size=args.batch)
        heads = {"new": ("features", 128), "rev": ("new", 64)}
        model = convnet_encoder(folder / "m.onnx", heads=heads, stages=NULL, seed=2)
        for run in range(args.runs):
            clocks = _Clocks()
            bench.time = clocks  # stage_costs reads its clock through the module's ``time``
            try:
                wall = bench.stage_costs(store, model, f"s{run}", args, args.layout)
            finally:
                bench.time = time
            settle = sum(b - a for a, b in zip(clocks.cpu[2::4], clocks.cpu[3::4], strict=True))
            shown = ", ".join(f"{k} {v:.0f}" for k, v in wall.items())
            cpu = settle / len(items) * 1e6
            print(
                f"{args.layout} run {run + 1}: wall µs a point: {shown}; settle CPU {cpu:.0f} µs a point; "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        store.close()


if __name__ == "__main__":
    main()
