"""How true ``rmq status``'s ETA is, and how fast ``rmq pause`` holds a running migration.

ETA: CIFAR-10 JPEGs (real files from ../shared/data) indexed into an old collection of the
embedded store, then migrated whole by ``rm_qdrant.migrate`` in a thread (by default a CNN
encoder of ResNet-18's cost, benchmarks/convnet.py, so that the run lasts minutes). When 10 %,
25 % and 50 % of the gallery is in new, the main thread reads ``rm_qdrant.status`` (what
``rmq status`` prints) and keeps its ETA; when the run returns (its last index build
included), the time the rest actually took is set beside it. Goal (issue 43): after the
first 10 %, within ±20 %.

Pause: a fresh pair of the same gallery migrated with ``--workers 2``; ``rm_qdrant.pause`` is
called from the main thread at about 30 %. Printed: the points and batches settled after the
pause (each worker may finish the batch it is encoding and the one it had claimed), the seconds
until the last of them (once none settled for 3 s), and that nothing moves in the next 3 s; then
resume and the run ends.
Goal: the pause takes effect within one batch (beyond those in flight) in every worker.

Run: ``python benchmarks/eta_accuracy.py [--n 20000] [--batch 500] [--model resnet18-size|small|ceiling]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cifar import cifar_root  # noqa: E402
from benchmarks.convnet import convnet_encoder  # noqa: E402
from benchmarks.migration_throughput import MODELS, NEW_HEADS, copy_gallery, indexed_gallery  # noqa: E402
from rm_qdrant import migrate, pause, resume, scan_image_folder, status  # noqa: E402
from rm_qdrant.serving.status import pair_status  # noqa: E402

CHECKS = (0.10, 0.25, 0.50)


def eta_run(store, model: Path, n: int, batch: int) -> tuple[list[tuple[float, float, float]], float]:
    """(share, ETA read then, seconds the rest took) at each of CHECKS; and the seconds from the
    last batch settled to the run's return (its last index build)."""
    copy_gallery(store, model, "eta")
    moved, done, last = [0], threading.Event(), [0.0]

    def on_batch(result) -> None:
        moved[0] += result.moved
        last[0] = time.perf_counter()

    thread = threading.Thread(
        target=lambda: (migrate(store, "eta", batch=batch, on_batch=on_batch), done.set())
    )
    thread.start()
    readings = []
    for share in CHECKS:
        while moved[0] < share * n and not done.is_set():
            time.sleep(0.05)
        eta = status(store, "eta").status.eta_seconds
        readings.append((share, time.perf_counter(), eta))
    thread.join()
    end = time.perf_counter()
    return [(share, eta, end - at) for share, at, eta in readings], end - last[0]


def pause_run(store, model: Path, n: int, batch: int) -> dict[str, float]:
    index = copy_gallery(store, model, "pause")
    settled: list[tuple[float, int]] = []
    run = threading.Thread(
        target=lambda: migrate(
            store,
            "pause",
            batch=batch,
            workers=2,
            on_batch=lambda r: settled.append((time.perf_counter(), r.moved)),
        )
    )
    run.start()
    while sum(m for _, m in settled) < 0.3 * n:
        time.sleep(0.01)
    paused_at = time.perf_counter()
    at_pause = len(settled)
    pause(store, "pause")
    quiet_since, seen = time.perf_counter(), len(settled)
    while time.perf_counter() - quiet_since < 3.0:  # the batches in flight settle, then none
        time.sleep(0.05)
        if len(settled) != seen:
            quiet_since, seen = time.perf_counter(), len(settled)
    in_new = pair_status(store, index.pair).new_count
    time.sleep(3.0)
    still = pair_status(store, index.pair).new_count
    after = settled[at_pause:]
    resume(store, "pause")
    run.join()
    return {
        "batches settled after the pause": len(after),
        "points settled after the pause": sum(m for _, m in after),
        "seconds from the pause to the last of them": (after[-1][0] - paused_at) if after else 0.0,
        "points moved in the 3 s after the last of them": still - in_new,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--model", choices=list(MODELS), default="resnet18-size")
    args = parser.parse_args()
    items = scan_image_folder(cifar_root() / "train")[: args.n]
    with tempfile.TemporaryDirectory(prefix="rmq-eta-") as tmp:
        folder = Path(tmp)
        store = indexed_gallery(folder, items, 1000)
        model = convnet_encoder(folder / "new.onnx", heads=NEW_HEADS, stages=MODELS[args.model][1], seed=2)
        load = os.getloadavg()[0]
        print(
            f"{args.n} CIFAR-10 images, encoder {args.model}, batch {args.batch}, "
            f"{os.cpu_count()} cores, load {load:.1f}"
        )
        print("\n| migrated | ETA read (s) | the rest took (s) | error |\n|---|---|---|---|")
        readings, build = eta_run(store, model, args.n, args.batch)
        for share, eta, took in readings:
            error = f"{(eta - took) / took:+.1%}" if eta is not None else "no ETA"
            print(f"| {share:.0%} | {eta or 0:.1f} | {took:.1f} | {error} |")
        print(f"(the rest includes the run's last index build after its last batch: {build:.1f} s)")
        print(f"\npause with 2 workers, batch {args.batch} (load {os.getloadavg()[0]:.1f}):")
        for key, value in pause_run(store, model, args.n, args.batch).items():
            print(f"  {key}: {value:.2f}" if isinstance(value, float) else f"  {key}: {value}")
        store.close()


if __name__ == "__main__":
    main()
