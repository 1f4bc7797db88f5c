"""How many threads should fetch a migration's local images: one, two, or the pace's choice.

Makes JPEG galleries of several sizes from the CIFAR-10 train images (32x32 as they are,
and resized copies in a temporary folder), then migrates each with the pipeline-ceiling
encoder (benchmarks/convnet.py: almost no work, so fetching, decoding and the store's writes
are all there is) and ``--fetch-workers`` 1, 2 and unset (``auto``: the migration's choice,
:class:`rm_qdrant.migration.loading.FetchPace`), in both layouts. The settings take turns
within each repeat (who goes first rotates), each on a fresh copy of the gallery, and each
figure is the median over the repeats, with the 1-minute load average beside it. The
``fetch CPU alone`` column is the CPU time one thread spends reading and decoding an image as
the encoder takes it, by itself; ``in the runs`` is what the pace measured in the ``auto``
migrations (the median over their batches: contention with the writer inflates it).

Run: ``python benchmarks/fetch_threads.py [--n 5000] [--repeats 3] [--sizes 32x32 96x96 160x120
320x240] [--out FILE]``
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

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cifar import ROOT, cifar_root  # noqa: E402
from benchmarks.convnet import NULL, convnet_encoder  # noqa: E402
from benchmarks.migration_throughput import NEW_HEADS, copy_gallery, indexed_gallery  # noqa: E402
from benchmarks.search_overhead import machine  # noqa: E402
from rm_qdrant import OnnxEncoder, scan_image_folder  # noqa: E402
from rm_qdrant.migration.loading import LIGHT_IMAGE, FetchPace  # noqa: E402
from rm_qdrant.migration.migrate import MigrateOptions, run_migration  # noqa: E402
from rm_qdrant.pair.record import LAYOUTS  # noqa: E402
from rm_qdrant.sources import ImageSource  # noqa: E402

SETTINGS = {"1": 1, "2": 2, "auto": None}
#: Every batch's pace (FetchPace.per_image) of the runs, as measured.
PACES: list[float] = []


def record_paces() -> None:
    """Wrap FetchPace.batch_done so that each batch's figure lands in PACES."""
    done = FetchPace.batch_done

    def recorded(self: FetchPace) -> None:
        done(self)
        if self.per_image is not None:
            PACES.append(self.per_image)

    FetchPace.batch_done = recorded


def gallery_images(folder: Path, size: str, n: int) -> list:
    """``n`` CIFAR-10 train images as ``size`` JPEGs (the originals for 32x32)."""
    items = scan_image_folder(cifar_root() / "train")[:n]
    if size == "32x32":
        return items
    width, height = (int(v) for v in size.split("x"))
    for item in items:
        target = folder / size / Path(item.uri).relative_to(cifar_root())
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.open(item.uri).resize((width, height), Image.BICUBIC).save(target, quality=90)
    return scan_image_folder(folder / size / "train")


def fetch_cpu(encoder: OnnxEncoder, items: list) -> float:
    """One thread's CPU seconds an image: read and decode as the encoder takes it."""
    sample = items[:1000]
    with ImageSource() as source:
        began = time.thread_time()
        for item in sample:
            encoder.decode(source.fetch(item.uri), max_pixels=source.config.max_pixels)
        return (time.thread_time() - began) / len(sample)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5_000, help="images a gallery")
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", nargs="+", default=["32x32", "96x96", "160x120", "320x240"])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fetch_threads.md")
    args = parser.parse_args()
    record_paces()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rmq-fetchbench-") as tmp:
        folder = Path(tmp)
        for size in args.sizes:
            items = gallery_images(folder / "images", size, args.n)
            (folder / size).mkdir(parents=True, exist_ok=True)
            store = indexed_gallery(folder / size, items, args.batch)
            model = convnet_encoder(folder / size / "ceiling.onnx", heads=NEW_HEADS, stages=NULL, seed=2)
            cpu = fetch_cpu(OnnxEncoder(model), items)
            rates: dict[tuple[str, str], list[float]] = {}
            loads: list[float] = []
            paces: list[float] = []
            for repeat in range(args.repeats):
                names = list(SETTINGS)
                turn = names[repeat % len(names) :] + names[: repeat % len(names)]
                for setting in turn:
                    for layout in LAYOUTS:
                        index = copy_gallery(store, model, f"r{repeat}-{setting}-{layout}", layout)
                        options = MigrateOptions(batch=args.batch, fetch_workers=SETTINGS[setting])
                        PACES.clear()
                        done = run_migration(index, options)
                        if setting == "auto":
                            paces += PACES
                        assert done.moved == len(items) and done.failed == 0, done
                        rate = done.moved / (done.seconds - done.optimize_seconds)
                        rates.setdefault((setting, layout), []).append(rate)
                        loads.append(os.getloadavg()[0])
                        shown = f"{size} {setting} {layout} run {repeat + 1}"
                        print(f"  {shown}: {rate:,.0f} points/s", flush=True)
            store.close()
            medians = {k: statistics.median(v) for k, v in rates.items()}
            rows.append((size, cpu, statistics.median(paces), medians, loads))
    report(args, rows)


def report(args: argparse.Namespace, rows: list) -> None:
    head = " | ".join(f"{layout}, {s}" for layout in LAYOUTS for s in SETTINGS)
    lines = [
        "# Fetch threads for local images: one, two, or the pace's choice",
        "",
        f"- Command: `python {' '.join(sys.argv)}`",
        f"- Machine: {machine()}; date: {date.today()}",
        f"- {args.n:,} CIFAR-10 train images a gallery (resized copies but 32x32), batch {args.batch}, "
        f"ceiling encoder, embedded store; points/s of the migration (index builds left out), median "
        f"of {args.repeats} repeats, settings in turn; `auto` takes one thread where the last "
        f"batch's fetch CPU (in the run) was under {LIGHT_IMAGE * 1e6:.0f} µs an image (LIGHT_IMAGE), else 2",
        "",
        f"| images | fetch CPU alone | in the runs | {head} | auto vs best | load 1m |",
        "|---|--:|--:|" + "--:|" * (2 * len(SETTINGS)) + "--:|--:|",
    ]
    for size, cpu, pace, rates, loads in rows:
        cells = " | ".join(f"{rates[(s, layout)]:,.0f}" for layout in LAYOUTS for s in SETTINGS)
        versus = min(
            rates[("auto", layout)] / max(rates[(s, layout)] for s in ("1", "2")) for layout in LAYOUTS
        )
        span = f"{min(loads):.1f}-{max(loads):.1f}"
        costs = f"{cpu * 1e6:.0f} µs | {pace * 1e6:.0f} µs"
        lines.append(f"| {size} | {costs} | {cells} | {versus:.2f} | {span} |")
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
