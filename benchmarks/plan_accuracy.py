"""How close ``rmq plan``'s time is to the migration it plans: planned against actual seconds.

Indexes ``--n`` CIFAR-10 JPEGs (real 32x32 files from ../shared/data, extracted once into
.cache/data by benchmarks/cifar.py) into an old collection of the embedded store, then for each
encoder (benchmarks/convnet.py, random weights: a CNN of ResNet-18's cost, a tiny CNN, and the
pipeline's ceiling, an encoder that does almost nothing) and each ``--workers`` count, on a fresh
pair over a copy of that gallery (its random order prepared, untimed, as ``rmq migrate --prepare``
would):

1. ``rm_qdrant.plan`` times ``--sample`` points and plans the whole gallery (``--batch``, the
   workers; no forecast), and its own wall seconds are taken;
2. ``rm_qdrant.migrate`` moves the whole gallery with the same ``--batch`` and workers; its
   seconds without the index builds (what the plan counts) and with them.

Printed: per stage the plan's ms a point and capacity, the bottleneck, the planned and actual
seconds and their ratio (planned / actual: above 1 the plan was pessimistic), with the 1-minute
load average beside each run: on a machine shared with other work a figure taken at load 6 on 2
cores says little about an idle one.

Run: ``python benchmarks/plan_accuracy.py [--n 10000] [--sample 64] [--batch 1000]
[--workers 1 2] [--models ceiling small resnet18-size] [--repeats 1] [--show]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import rm_qdrant  # noqa: E402
from benchmarks.cifar import cifar_root  # noqa: E402
from benchmarks.convnet import NULL, RESNET18_SIZE, SMALL, convnet_encoder  # noqa: E402
from benchmarks.search_overhead import machine  # noqa: E402
from rm_qdrant import OnnxEncoder, create_pair, index_images, open_store, scan_image_folder  # noqa: E402
from rm_qdrant.cli.plan import plan_text  # noqa: E402
from rm_qdrant.migration.ranking import prepare_order, read_all  # noqa: E402
from rm_qdrant.pair.record import load_pair, save_pair  # noqa: E402
from rm_qdrant.store import Where  # noqa: E402

MODELS = {
    "ceiling": ("pipeline ceiling (almost no encoder)", NULL),
    "small": ("tiny CNN (~6 M multiply-adds)", SMALL),
    "resnet18-size": ("CNN of ResNet-18's cost (~300 M)", RESNET18_SIZE),
}
#: The new models' outputs: ``new``, and ``rev`` = ψ(new) of the old model's size.
NEW_HEADS = {"new": ("features", 128), "rev": ("new", 64)}


def fresh_pair(store, model: Path, name: str) -> None:
    """A copy of the gallery's old collection paired with ``model``, its random order prepared."""
    ids, payloads, vectors = read_all(store, "gallery", Where(), True)
    store.create_collection(f"{name}-old", dim=vectors.shape[1], distance="cosine")
    store.upsert(f"{name}-old", ids, vectors, payloads)
    create_pair(store, name, old_collection=f"{name}-old", encoder=OnnxEncoder(model))
    save_pair(store, prepare_order(store, load_pair(store, name), "random"))


def one_run(store, model: Path, name: str, args: argparse.Namespace, workers: int) -> dict:
    fresh_pair(store, model, name)
    load_plan, started = os.getloadavg()[0], time.perf_counter()
    planned = rm_qdrant.plan(
        store, name, sample=args.sample, batch=args.batch, workers=workers, forecast=False
    )
    plan_seconds = time.perf_counter() - started
    if args.show:
        print(plan_text(planned.as_dict()), flush=True)
    load_migrate = os.getloadavg()[0]
    report = rm_qdrant.migrate(store, name, batch=args.batch, workers=workers)
    assert report.moved == planned.points and report.failed == 0, report
    actual = report.seconds - report.optimize_seconds
    return {
        "stages": {s.name: (s.seconds, s.rate) for s in planned.capacity.stages},
        "bottleneck": planned.capacity.bottleneck.name,
        "planned": planned.seconds,
        "actual": actual,
        "with_builds": report.seconds,
        "plan_seconds": plan_seconds,
        "load": (load_plan + load_migrate) / 2,
        "fetch_threads": planned.setup.fetch_threads,
    }


def table(label: str, workers: int, runs: list[dict]) -> list[str]:
    first = runs[0]
    stages = ", ".join(
        f"{name} {'-' if ms is None else f'{ms * 1000:.3f} ms'} ({rate:,.0f}/s)"
        for name, (ms, rate) in first["stages"].items()
    )
    planned = statistics.median(r["planned"] for r in runs)
    actual = statistics.median(r["actual"] for r in runs)
    builds, took, load = (
        statistics.median(r[key] for r in runs) for key in ("with_builds", "plan_seconds", "load")
    )
    return [
        f"| {label} | {workers} | {first['fetch_threads']} | {first['bottleneck']} | {planned:.1f} "
        f"| {actual:.1f} | {builds:.1f} | {planned / actual:.2f} | {took:.1f} | {load:.1f} |",
        f"|   stages (first run): {stages} | | | | | | | | | |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="images to migrate (CIFAR-10 train)")
    parser.add_argument("--sample", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--show", action="store_true", help="print each plan as rmq plan prints it")
    args = parser.parse_args()
    items = scan_image_folder(cifar_root() / "train")[: args.n]
    with tempfile.TemporaryDirectory(prefix="rmq-plan-accuracy-") as tmp:
        folder = Path(tmp)
        old = convnet_encoder(folder / "old.onnx", heads={"embedding": ("features", 64)}, seed=1)
        store = open_store(folder / "qdrant")
        index_images(store, "gallery", OnnxEncoder(old), items, batch_size=args.batch)
        lines = [
            f"plan_accuracy: {len(items):,} CIFAR-10 JPEGs, --sample {args.sample}, --batch {args.batch}, "
            f"embedded store, paired layout; {machine()}; {date.today()}",
            "",
            "| encoder | workers | fetch threads | bottleneck | planned s | actual s | with index builds s "
            "| planned / actual | plan took s | load |",
            "|---|--:|--:|---|--:|--:|--:|--:|--:|--:|",
        ]
        for key in args.models:
            label, stages = MODELS[key]
            model = convnet_encoder(folder / f"{key}.onnx", heads=NEW_HEADS, stages=stages, seed=2)
            for workers in args.workers:
                runs = [
                    one_run(store, model, f"{key}-{workers}-{r}", args, workers) for r in range(args.repeats)
                ]
                lines += table(label, workers, runs)
                print("\n".join(lines[-2:]), flush=True)
        store.close()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
