"""Migration throughput against the encoder's own throughput, in one run.

Indexes CIFAR-10 JPEGs (real files from ../shared/data) into an old collection of the
embedded store, then, for each encoder, on the same images and batch size:

- the encoder alone: ONNX Runtime over pre-decoded batches (no I/O at all), with the
  migration's own session options (``OnnxEncoder(model)``: ONNX Runtime's threads do not
  spin between calls) and with spinning threads (ONNX Runtime's default, its best with the
  machine to itself); the ratio divides by the first (the same encoder the migration runs),
  and ``vs best`` by the faster of the two;
- ``rmq migrate``'s engine on a fresh pair of that gallery: fetch + decode + encode +
  Qdrant writes, end to end, in each ``--layout``: ``paired`` (a copy of the old collection,
  points moved to a new collection) and ``single-collection`` (a copy of the old collection
  that gets the named vector ``new``; migrating a point adds it). With both, each repeat
  migrates in both layouts, one after the other, who goes first alternating per repeat.

Encoders (benchmarks/convnet.py, random weights): a CNN of ResNet-18's cost (~300 M
multiply-adds per 32x32 image), a tiny CNN (~6 M), and for the pipeline's ceiling one
that does almost nothing (pooling and a matrix product), which is what the CPU side of a
backfill sees when the model runs on a GPU. Each figure is the median of ``--repeats``
runs; the encoder alone is measured right before and after each migration and averaged,
so drift on a shared machine hits both sides alike. The 1-minute load average is printed
beside every figure (``os.getloadavg()``): on a machine shared with other work, a figure
taken at load 6 on 2 cores says little about an idle one. ``migration`` is the pipeline's
rate; ``with index builds`` adds the embedded store's optimisations the run does (at its
end, and every ``optimize_every`` seconds: rm_qdrant/backfill/upkeep.py), which the encoder
alone does not do.

Run: ``python benchmarks/migration_throughput.py [--n 20000] [--batch 1000] [--repeats 3]
[--layout paired|single-collection|both]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cifar import ROOT, cifar_root  # noqa: E402
from benchmarks.convnet import NULL, RESNET18_SIZE, SMALL, convnet_encoder  # noqa: E402
from benchmarks.search_overhead import machine  # noqa: E402
from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, open_store, scan_image_folder  # noqa: E402
from rm_qdrant.backfill.migrate import MigrateOptions, Migrator, run_migration  # noqa: E402
from rm_qdrant.backfill.pair import LAYOUTS, PAIRED, SINGLE  # noqa: E402
from rm_qdrant.backfill.ranking import plan, prepare_order, read_all  # noqa: E402
from rm_qdrant.sources import ImageSource, SourceConfig  # noqa: E402
from rm_qdrant.store import Where  # noqa: E402

MODELS = {
    "resnet18-size": ("CNN of ResNet-18's cost (~300 M multiply-adds)", RESNET18_SIZE),
    "small": ("tiny CNN (~6 M multiply-adds)", SMALL),
    "ceiling": ("pipeline ceiling: an encoder that does almost nothing", NULL),
}
RESULTS = ROOT / "benchmarks" / "results"
STAGES = ("fetch, decode and store reads", "encode", "store writes and read-backs")


def encoder_alone(encoder: OnnxEncoder, pixels: np.ndarray, batch: int) -> float:
    pixels = pixels[: max(5_000, len(pixels) // 4)]  # a steady rate needs no more
    start = time.perf_counter()
    for i in range(0, len(pixels), batch):
        encoder.run_pixels(pixels[i : i + batch], ["new"])
    return len(pixels) / (time.perf_counter() - start)


def copy_gallery(store, model: Path, name: str, layout: str = PAIRED) -> DualIndex:
    """A fresh copy of the gallery's old collection, paired with ``model`` in ``layout`` (in one
    collection: the new vector ``new`` added to the copy), its order prepared (untimed)."""
    ids, payloads, vectors = read_all(store, "gallery", Where(), True)
    store.create_collection(f"{name}-old", dim=vectors.shape[1], distance="cosine")
    store.upsert(f"{name}-old", ids, vectors, payloads)
    new_vector = "new" if layout == SINGLE else None
    encoder = OnnxEncoder(model)
    create_pair(
        store, name, old_collection=f"{name}-old", encoder=encoder, layout=layout, new_vector=new_vector
    )
    index = DualIndex.open(store, name)
    index.pair = prepare_order(store, index.pair, "random")  # `rmq migrate --prepare`
    return index


def load() -> float:
    """The 1-minute load average, read beside each figure."""
    return os.getloadavg()[0]


def one_run(store, model: Path, name: str, pixels: np.ndarray, args: argparse.Namespace, layout: str) -> dict:
    """The gallery migrated whole on a fresh pair in ``layout``; the encoder alone measured around
    it, with the migration's session options (``same``) and with spinning threads (``spin``)."""
    index = copy_gallery(store, model, name, layout)
    same, spin = OnnxEncoder(model), OnnxEncoder(model, spin=True)
    before = {
        "same": encoder_alone(same, pixels, args.batch),
        "spin": encoder_alone(spin, pixels, args.batch),
    }
    load_before, cpu = load(), time.process_time()
    report = run_migration(index, MigrateOptions(batch=args.batch, fetch_workers=args.fetch_workers))
    load_during, cpu = load(), time.process_time() - cpu
    after = {"spin": encoder_alone(spin, pixels, args.batch), "same": encoder_alone(same, pixels, args.batch)}
    assert report.moved == len(pixels) and report.failed == 0, report
    optimizing = getattr(report, "optimize_seconds", 0.0)  # the base of a before/after comparison lacks it
    return {
        "encoder": (before["same"] + after["same"]) / 2,
        "encoder_spin": (before["spin"] + after["spin"]) / 2,
        "migration": report.moved / (report.seconds - optimizing),
        "with_builds": report.moved / report.seconds,
        "cpu_us": cpu / report.moved * 1e6,  # all threads: what the run costs, whatever the load
        "load_encoder": (load_before + load()) / 2,
        "load_migration": load_during,
    }


def stage_costs(store, model: Path, name: str, args: argparse.Namespace, layout: str) -> dict[str, float]:
    """Microseconds a point spends in each stage when they run one after another, on one thread each."""
    index = copy_gallery(store, model, name, layout)
    migrator = Migrator(index, MigrateOptions(batch=args.batch, fetch_workers=1))
    ids = plan(store, index.pair, migrator.options)
    spent = dict.fromkeys(STAGES, 0.0)
    with ImageSource(SourceConfig()) as source, ThreadPoolExecutor(1) as fetch:
        for start in range(0, len(ids), args.batch):
            clock = [time.perf_counter()]
            prepared = migrator._prepare(ids[start : start + args.batch], source, fetch)
            clock.append(time.perf_counter())
            encoded = migrator._encode(prepared)
            clock.append(time.perf_counter())
            migrator._settle(prepared, encoded)
            clock.append(time.perf_counter())
            for stage, begin, end in zip(STAGES, clock, clock[1:], strict=False):
                spent[stage] += end - begin
    return {stage: seconds / len(ids) * 1e6 for stage, seconds in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="images to migrate (CIFAR-10 train)")
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument(
        "--fetch-workers", type=int, default=None, help="fetch threads (default: the migration's own choice)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--layout", choices=[*LAYOUTS, "both"], default="both")
    args = parser.parse_args()
    layouts = list(LAYOUTS) if args.layout == "both" else [args.layout]
    items = scan_image_folder(cifar_root() / "train")[: args.n]
    figures: dict[str, dict[str, list[dict]]] = {}
    stages: dict[str, dict[str, float]] = {}
    stage_loads: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="rmq-migbench-") as tmp:
        folder = Path(tmp)
        old = OnnxEncoder(convnet_encoder(folder / "old.onnx", heads={"embedding": ("features", 64)}, seed=1))
        store = open_store(folder / "qdrant")
        index_images(store, "gallery", old, items, batch_size=args.batch)
        heads = {"new": ("features", 128), "rev": ("new", 64)}
        for key in args.models:
            model = convnet_encoder(folder / f"{key}.onnx", heads=heads, stages=MODELS[key][1], seed=2)
            decoder = OnnxEncoder(model)
            pixels = np.stack([decoder.decode(item.uri) for item in items])
            figures[key] = {layout: [] for layout in layouts}
            for repeat in range(args.repeats):
                turn = layouts[repeat % len(layouts) :] + layouts[: repeat % len(layouts)]  # who goes first
                for layout in turn:
                    name = f"{key}-{repeat}" + ("-one" if layout == SINGLE else "")
                    figures[key][layout].append(one_run(store, model, name, pixels, args, layout))
                    shown = {k: round(v, 1) for k, v in figures[key][layout][-1].items()}
                    print(f"  {key} {layout} run {repeat + 1}: {shown}", flush=True)
            if key == "ceiling":
                for layout in layouts:
                    stages[layout] = stage_costs(store, model, f"stages-{layout}", args, layout)
                    stage_loads[layout] = load()
        store.close()
    report(args, figures, stages, stage_loads)


def report(
    args: argparse.Namespace, figures: dict[str, dict[str, list[dict]]], stages: dict, loads: dict
) -> None:
    lines = [
        f"command: python {' '.join(sys.argv)}",
        f"machine: {machine()}; date: {date.today()}",
        f"images: {args.n:,} CIFAR-10 train JPEGs (32x32), batch {args.batch}, "
        f"fetch workers {args.fetch_workers or 'by source (2 for local files)'}, embedded store; "
        f"median of {args.repeats} runs; "
        "with both layouts, each repeat runs both (who goes first alternates); `vs paired`: the "
        "median of single-collection / paired migration throughput over the repeats; ratio: migration / "
        "encoder alone with the migration's session options; `vs best`: migration / the faster of the "
        "two encoder figures; CPU a point: the process's CPU time (all threads) over the run, a "
        "point, which a loaded machine inflates far less than the rates; load: the 1-minute load "
        "average while each was measured (2 cores: "
        "above 2, other work shared them)",
        "",
        "| encoder (random weights, ONNX Runtime, CPU) | layout | encoder alone, migration's options "
        "| encoder alone, spinning threads | load | migration | with index builds | CPU a point | load "
        "| ratio | vs best | vs paired |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    summary: dict = {}
    for key, by_layout in figures.items():
        summary[key] = {}
        for layout, runs in by_layout.items():
            row = {f: statistics.median(r[f] for r in runs) for f in runs[0]}
            row["ratio"] = statistics.median(r["migration"] / r["encoder"] for r in runs)
            row["vs_best"] = statistics.median(
                r["migration"] / max(r["encoder"], r["encoder_spin"]) for r in runs
            )
            summary[key][layout] = {**row, "runs": runs}
            vs = ""
            if layout == SINGLE and PAIRED in by_layout:
                pairs = zip(runs, by_layout[PAIRED], strict=True)
                summary[key][layout]["vs_paired"] = statistics.median(
                    s["migration"] / p["migration"] for s, p in pairs
                )
                vs = f"{summary[key][layout]['vs_paired']:.2f}x"
            ratio, best = (
                ("—", "—") if key == "ceiling" else (f"**{row['ratio']:.2f}**", f"{row['vs_best']:.2f}")
            )
            lines.append(
                f"| {MODELS[key][0]} | {layout} | {row['encoder']:,.0f} points/s "
                f"| {row['encoder_spin']:,.0f} points/s | {row['load_encoder']:.1f} "
                f"| {row['migration']:,.0f} points/s | {row['with_builds']:,.0f} points/s "
                f"| {row['cpu_us']:.0f} µs | {row['load_migration']:.1f} | {ratio} | {best} | {vs} |"
            )
    if stages:
        summary["stages_us_per_point"] = stages
        summary["stages_load"] = loads
        lines += [
            "",
            "Where a point's time goes with the ceiling encoder, the stages one after another "
            "(one thread each, microseconds a point):",
            "",
            f"| stage | {' | '.join(stages)} |",
            "|---|" + "--:|" * len(stages),
            *(f"| {stage} | {' | '.join(f'{s[stage]:.0f}' for s in stages.values())} |" for stage in STAGES),
            f"| all (serial) | {' | '.join(f'{sum(s.values()):.0f}' for s in stages.values())} |",
            f"| load (1-minute average) | {' | '.join(f'{loads[layout]:.1f}' for layout in stages)} |",
        ]
    text = "\n".join(lines)
    print("\n" + text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "migration_throughput.md").write_text(text + "\n")
    (RESULTS / "migration_throughput.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
