"""Photo preprocessing and migration throughput per size class, before issue 42 and now (exact, fast).

On the catalogue-photo gallery of benchmarks/photo_gallery.py (0.3 to 12 megapixels), in one
run on one machine, per size class:

- the time an image takes to become the 224 x 224 pixels of a ``Resize(256)`` +
  ``CenterCrop(224)`` graph: (a) the code before issue 42 (a frozen copy,
  benchmarks/photo_before.py), (b) ``pixels(..., decode="exact")``, (c) ``decode="fast"``,
  best and median of ``--repeats`` passes, the three interleaved; the ratios before/exact
  and before/fast;
- decode-only ceilings: ``simplejpeg.decode_jpeg`` at full size and at its DCT scale that
  covers 256 (YCbCr and grey JPEGs), Pillow for PNG, WebP and CMYK JPEGs, from bytes in memory;
- where the exact path's time goes: read, decode, convert, resize (+ crop), layout (float32
  NCHW, ImageNet mean/std: ``OnnxEncoder.layout``), encode (each graph, batched), write (an
  embedded store's upsert, a point);
- fidelity: how many photos' exact pixels differ from the code before (must be 0); fast vs
  exact: mean |Δ| in pixel levels, and the cosine of the graph's vectors (min, median);
- ``run_migration`` on the embedded store with a cheap encoder (benchmarks/photo_graphs.py),
  exact and fast, 1 and 2 fetch workers, points/s against the decode alone on as many
  threads and against the encoder alone.

The graph (``--graph``) is a random-init ResNet-50 (exported once into the cache folder, about
40 s) or the cheap one; its cosines are a stand-in for a trained model's. The goals of issue 42
are printed beside the figures, each met or missed. The 1-minute load average is printed with
each section: on 2 cores, above 2 means other work shared them.

Run: ``python benchmarks/photo_throughput.py [--gallery DIR] [--repeats 5] [--graph resnet50|cheap]
[--points 40] [--quick] [--json OUT] [--out FILE.md]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import photo_gallery, photo_measure, photo_migration  # noqa: E402
from benchmarks.photo_graphs import cheap_graph, resnet50_graph  # noqa: E402
from benchmarks.search_overhead import machine  # noqa: E402
from rm_qdrant import OnnxEncoder, open_store  # noqa: E402


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def classes(folder: Path, entries: list[dict]) -> dict[str, list[dict]]:
    """The manifest's photos by size class, smallest class first."""
    out: dict[str, list[dict]] = {}
    for entry in sorted(entries, key=lambda e: e["width"] * e["height"]):
        out.setdefault(entry["size_class"], []).append(entry)
    return out


def measure(args: argparse.Namespace, folder: Path, by_class: dict, tmp: Path) -> dict:
    cheap = OnnxEncoder(cheap_graph(tmp / "cheap.onnx"))
    graph = OnnxEncoder(resnet50_graph()) if args.graph == "resnet50" else cheap
    role = "embedding" if args.graph == "resnet50" else "new"
    encoders = {"cheap": cheap, **({"ResNet-50": graph} if args.graph == "resnet50" else {})}
    result: dict = {"load": {"start": load()}, "classes": {}}
    with open_store(tmp / "qdrant") as store:
        for key, entries in by_class.items():
            paths = [folder / e["file"] for e in entries]
            print(f"  {key}: {len(paths)} photos, load {load()}", flush=True)
            row: dict = {"photos": len(paths), "mb": statistics.mean(e["bytes"] for e in entries) / 1e6}
            row["entries"] = entries
            row["pre"] = photo_measure.preprocessing(paths, args.repeats)
            row["decode"] = photo_measure.decode_ceilings(entries, folder, args.repeats)
            row["stages"] = photo_measure.stages(paths, encoders, tmp / f"scratch-{key}")
            row["fidelity"] = photo_measure.fidelity(paths, graph, role)
            pixels = np.stack([cheap.decode(p) for p in paths])
            row["encoder"] = {
                n: photo_measure.encoder_ceiling(e, pixels, args.repeats) for n, e in encoders.items()
            }
            row["load_pre"] = load()
            row["migration"] = photo_migration.size_class(store, key, paths, cheap.path, args)
            row["load_migration"] = load()
            result["classes"][key] = row
    everything = [r["fidelity"]["exact_unit"] for r in result["classes"].values()]
    gallery = np.concatenate(everything)
    between = gallery @ gallery.T
    result["between"] = (
        float(np.median(between[np.triu_indices(len(gallery), 1)])) if len(gallery) > 1 else 0.0
    )
    for row in result["classes"].values():
        del row["fidelity"]["exact_unit"]
    result["load"]["end"] = load()
    return result


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def tables(args: argparse.Namespace, result: dict) -> list[str]:
    rows = result["classes"]
    lines = [
        "## Preprocessing, ms an image (best / median of the passes)",
        "",
        "| class | photos | MB avg | before | exact | fast | before/exact | before/fast |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for key, r in rows.items():
        b, e, f = (r["pre"]["class"][v] for v in photo_measure.VARIANTS)
        lines.append(
            f"| {key} | {r['photos']} | {r['mb']:.2f} | {ms(b[0])} / {ms(b[1])} | {ms(e[0])} / {ms(e[1])} "
            f"| {ms(f[0])} / {ms(f[1])} | {b[0] / e[0]:.2f}x / {b[1] / e[1]:.2f}x "
            f"| {b[0] / f[0]:.2f}x / {b[1] / f[1]:.2f}x |"
        )
    lines += by_kind(rows)
    kinds = sorted({k for r in rows.values() for k in r["decode"]})
    lines += ["", "## Decode alone, ms an image (best; bytes in memory; count)", ""]
    lines += ["| class | " + " | ".join(kinds) + " |", "|---|" + "--:|" * len(kinds)]
    for key, r in rows.items():
        cells = [f"{ms(r['decode'][k][0])} ({r['decode'][k][1]})" if k in r["decode"] else "" for k in kinds]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    stage_names = list(next(iter(rows.values()))["stages"]["ms"])
    lines += [
        "",
        "## The exact path's stages, ms an image (best of 2; encode: batched, the class's photos)",
        "",
    ]
    lines += [
        "| class | " + " | ".join(stage_names) + " | sum to layout |",
        "|---|" + "--:|" * (len(stage_names) + 1),
    ]
    for key, r in rows.items():
        s = r["stages"]["ms"]
        upto = sum(s[k] for k in ("read", "decode", "convert", "resize", "layout"))
        lines.append(f"| {key} | " + " | ".join(f"{s[k]:.2f}" for k in stage_names) + f" | {upto:.1f} |")
    graph = (
        "random-init ResNet-50, torchvision's initialisation (a stand-in: no trained weights offline)"
        if args.graph == "resnet50"
        else "cheap graph (16 x 16 average pooling: blind to fine detail)"
    )
    lines += [
        "",
        f"## Fidelity: exact vs before, fast vs exact (cosine: {graph})",
        "",
        "Cosine of the graph's vectors, fast vs exact, and for scale exact vs exact with ±1 level "
        "of uniform noise, and vs exact shifted by one pixel.",
        "",
        "| class | exact ≠ before | fast mean abs Δ levels (mean, max photo) | PSNR dB (min, median) "
        "| cosine min | cosine median | ±1 noise: median | 1-px shift: median |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for key, r in rows.items():
        fid = r["fidelity"]
        lines.append(
            f"| {key} | {len(fid['differ'])} | {statistics.mean(fid['delta']):.2f}, {max(fid['delta']):.2f} "
            f"| {min(fid['psnr']):.1f}, {statistics.median(fid['psnr']):.1f} "
            f"| {min(fid['cosine']):.5f} | {statistics.median(fid['cosine']):.5f} "
            f"| {statistics.median(fid['cosine_noise']):.5f} | {statistics.median(fid['cosine_shift']):.5f} |"
        )
    cos = [c for r in rows.values() for c in r["fidelity"]["cosine"]]
    differ = [f for r in rows.values() for f in r["fidelity"]["differ"] + r["stages"]["differ"]]
    lines += [
        "",
        f"Over the gallery: {len(cos)} photos, exact ≠ before on {len({*differ})} "
        f"({', '.join(sorted({*differ})) or 'none'}); fast vs exact cosine min {min(cos):.5f}, "
        f"median {statistics.median(cos):.5f}; for scale, two different photos' exact vectors: "
        f"median cosine {result['between']:.3f}. A random-init net's cosines say how far apart "
        "its inputs are as that net sees them, not what a trained model would make of it: "
        "benchmarks/photo_graphs.py.",
    ]
    lines += [
        "",
        "## Migration, cheap encoder, points/s (median of runs) against its ceilings",
        "",
        "`w`: fetch workers; `decode alone`: the encoder's decode (read, decode, resize, crop) on as "
        "many threads, measured right before each migration; ratio: the median of migration / decode "
        "alone over the runs; `decoded as`: what the stored vectors show; load: the 1-minute load "
        "average over the runs (median).",
        "",
        "| class | mode | w | migration | decode alone | ratio | encoder alone | decoded as | load |",
        "|---|---|--:|--:|--:|--:|--:|---|--:|",
    ]
    for key, r in rows.items():
        mig = r["migration"]
        for label, rate in mig["median"].items():
            mode, workers = label.split()
            ceiling = mig["decode"][label]
            runs = mig["runs"][label]
            lines.append(
                f"| {key} | {mode} | {workers} | {rate:.1f} | {ceiling:.1f} | {mig['ratio'][label]:.2f} "
                f"| {r['encoder']['cheap']:.0f} | {mig['decoded_as'].get(mode, '')} "
                f"| {statistics.median(float(x['load']) for x in runs):.2f} |"
            )
    if args.graph == "resnet50":
        alone = ", ".join(f"{k} {r['encoder']['ResNet-50']:.1f}" for k, r in rows.items())
        lines += ["", f"ResNet-50 (random init) alone, images/s on decoded pixels: {alone}."]
    return lines


def kind(entry: dict) -> str:
    """A photo's kind as its decode cost sees it: format, colour, JPEG encoding."""
    if entry["format"] != "JPEG":
        return entry["format"]
    if entry["mode"] != "RGB":
        return f"JPEG {entry['mode']}"
    return f"JPEG {entry['subsampling']}" + (" progressive" if entry["progressive"] else "")


def by_kind(rows: dict) -> list[str]:
    """Each kind of photo's median ms, before / exact / fast, by class."""
    cells: dict[str, dict[str, list[tuple[float, ...]]]] = {}
    for key, r in rows.items():
        times = r["pre"]["photo"]
        for i, entry in enumerate(r["entries"]):
            cells.setdefault(kind(entry), {}).setdefault(key, []).append(
                tuple(times[v][i] for v in photo_measure.VARIANTS)
            )
    lines = [
        "",
        "By kind of photo, ms an image (each photo's median over the passes, then the mean over "
        "the kind's photos in the class): before / exact / fast",
        "",
        "| kind | " + " | ".join(rows) + " |",
        "|---|" + "--:|" * len(rows),
    ]
    for name in sorted(cells):
        shown = []
        for key in rows:
            got = cells[name].get(key)
            mean = [statistics.mean(t[j] for t in got) * 1e3 for j in range(3)] if got else None
            shown.append(" / ".join(f"{m:.1f}" for m in mean) if mean else "")
        lines.append(f"| {name} | " + " | ".join(shown) + " |")
    return lines


def goals(result: dict) -> list[str]:
    rows = result["classes"]

    def ratio(key: str, variant: str) -> float | None:
        if key not in rows:
            return None
        pre = rows[key]["pre"]["class"]
        return pre["before"][0] / pre[variant][0]

    def mark(ok: bool | None) -> str:
        return "not measured (class absent)" if ok is None else ("**met**" if ok else "**missed**")

    def baseline_ratio(key: str, variant: str) -> float | None:
        """The same ratio over the class's plain 4:2:0 JPEGs only (the issue's own photos)."""
        if key not in rows:
            return None
        times = rows[key]["pre"]["photo"]
        picked = [i for i, e in enumerate(rows[key]["entries"]) if kind(e) == "JPEG 4:2:0"]
        if not picked:
            return None
        return statistics.mean(times["before"][i] for i in picked) / statistics.mean(
            times[variant][i] for i in picked
        )

    def both(key: str, variant: str) -> tuple[float | None, str]:
        got, plain = ratio(key, variant), baseline_ratio(key, variant)
        shown = "-" if got is None else f"{got:.2f}x over the class (every format)"
        return plain, shown + ("" if plain is None else f", {plain:.2f}x over its plain 4:2:0 JPEGs")

    cos = [c for r in rows.values() for c in r["fidelity"]["cosine"]]
    median_cos = statistics.median(cos)
    lines = ["", "## Goals of issue 42", ""]
    lines.append(
        "Judged on the plain 4:2:0 JPEGs (what the issue measured: JPEG quality 90 made from the "
        "same bundled photos); the class figure, with progressive JPEGs, PNG and WebP, is beside it."
    )
    lines.append("")
    for key, variant, want in (("4000x2667", "exact", 2.0), ("1600x1067", "exact", 1.5)):
        plain, shown = both(key, variant)
        lines.append(
            f"- exact ≥ {want}x before on {key}: {shown} — {mark(None if plain is None else plain >= want)}"
        )
    plain, shown = both("4000x2667", "fast")
    lines.append(f"- fast ≥ 5x before on 4000x2667: {shown} — {mark(None if plain is None else plain >= 5)}")
    lines.append(
        f"- fast's median cosine ≥ 0.995 to exact: {median_cos:.5f} on this run's graph (random "
        "init: a stand-in); on a trained network see benchmarks/results/photo_fidelity.md"
    )
    shares = [
        (mig["ratio"][label], key, label)
        for key, r in rows.items()
        for mig in [r["migration"]]
        for label in mig["median"]
    ]
    worst = min(shares)
    below = ", ".join(f"{k} {lab} {s:.2f}" for s, k, lab in shares if s < 0.8) or "none"
    lines.append(
        "- migration with a cheap encoder ≥ 0.8 of the decode-only ceiling at every size: lowest "
        f"{worst[0]:.2f} ({worst[1]}, {worst[2]} fetch worker(s)); below 0.8: "
        f"{below} — {mark(worst[0] >= 0.8)}"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gallery", type=Path, default=None, help="a photo_gallery.py folder (default: built)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed passes (preprocessing, decode)")
    parser.add_argument("--migration-repeats", type=int, default=3, help="migrations of each kind per class")
    parser.add_argument(
        "--points",
        type=int,
        default=40,
        help="points a migration moves at 4 MP and up (more for smaller photos: × 4 MP / the class's MP)",
    )
    parser.add_argument("--batch", type=int, default=16, help="migration batch")
    parser.add_argument("--graph", choices=["resnet50", "cheap"], default="resnet50")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 2 photos a class, 1 repeat, cheap graph"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here too")
    args = parser.parse_args()
    # a pair's advice on writes that bypass it, once per pair: nothing a benchmark does
    logging.getLogger("rm_qdrant").setLevel(logging.ERROR)
    if args.quick:
        args.repeats, args.migration_repeats, args.points, args.batch, args.graph = 1, 1, 8, 4, "cheap"
    started = time.perf_counter()
    if args.gallery is not None:
        folder, entries = args.gallery, photo_gallery.read_manifest(args.gallery)
        if not entries:
            raise SystemExit(
                f"{args.gallery} has no {photo_gallery.MANIFEST}: build it with photo_gallery.py"
            )
    else:
        folder, entries = photo_gallery.build(per_class=2 if args.quick else 10)
    by_class = classes(folder, entries)
    print(f"command: python {' '.join(sys.argv)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="rmq-photos-") as tmp:
        result = measure(args, folder, by_class, Path(tmp))
    lines = [
        "# Photo preprocessing and migration throughput by size class (issue 42)",
        "",
        f"- Command: `python {' '.join(sys.argv)}`",
        f"- Machine: {machine()}, no GPU; date {date.today()}; {time.perf_counter() - started:.0f} s",
        f"- Gallery: {folder} ({len(entries)} photos, benchmarks/photo_gallery.py); {args.repeats} timed "
        f"passes; {args.migration_repeats} migrations of each kind a class, {args.points} points a "
        f"class of 4 MP and up (× 4 MP / MP below), batch {args.batch}",
        f"- 1-minute load average: start {result['load']['start']}, end {result['load']['end']}, and "
        "beside each migration (2 cores: above 2, other work shared them)",
        "",
        *tables(args, result),
        *goals(result),
    ]
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.json:
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **result}, indent=1)
        )


if __name__ == "__main__":
    main()
