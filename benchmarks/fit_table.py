"""``rmq fit`` through a team's path: ONNX backbones, an indexed gallery, heads fitted from the pair.

Steps (each a real ``rmq`` command, timed):

1. old and new backbones trained with ``rmq train backbone`` (cached under ``.cache/fit-bench``);
2. both exported to ONNX and described with ``rmq model stamp``;
3. the training images indexed into a collection with the old model (``rmq index``), and a
   pair made on it (``rmq init``): the team's live gallery;
4. ``rmq fit`` from that pair (``--sample``, default 20,000): Procrustes, label-free, and
   with ``--label-field label``; beside them the trainer's MCL + ρ (``rmq train heads`` on
   the same backbones, ``rmq export --new-onnx``);
5. every graph scored on the test images: each test image a query against the other test
   images as the gallery, backfilled in a random order, 11 points. Gain = (AUC − AUC_Old) /
   (AUC_New − AUC_Old). The fitted heads never saw a test image.

``--served`` also measures the label-free graph as served (``rmq init`` on the test images,
``rmq eval``). ``rmq eval`` migrates in its own random order, not the offline permutation, so
its ends (t = 0 and 1) match the offline row and the points between differ by the order.

Run: ``python benchmarks/fit_table.py [--data cifar|digits] [--new-arch A --new-dim D]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cifar import ROOT, cifar_root  # noqa: E402
from benchmarks.cifar_table import machine  # noqa: E402
from benchmarks.fit_summary import kept_without_force  # noqa: E402
from rm_qdrant import OnnxEncoder, load_pair, open_store, scan_image_folder  # noqa: E402
from rm_qdrant.core.metrics import FRACTIONS, area, backfill_retrieval, gain, migrated_at  # noqa: E402

RMQ = [sys.executable, "-m", "rm_qdrant"]


def rmq(*args: object, store: Path | None = None) -> tuple[str, float]:
    """Run one rmq command; returns (stdout, seconds). Exits with its output when it fails."""
    command = [*RMQ, *(["--qdrant", str(store)] if store else []), *map(str, args)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"failed: {' '.join(command)}\n{done.stdout}\n{done.stderr}")
    print(f"  {' '.join(map(str, args[:2]))}: {seconds:.0f} s", flush=True)
    return done.stdout, seconds


def dataset(name: str, work: Path) -> Path:
    if name == "cifar":
        return cifar_root()
    from rm_qdrant_train.demo import write_digits

    root = work / "digits"
    if not (root / "test").is_dir():
        write_digits(root)
    return root


def backbones(args: argparse.Namespace, data: Path, runs: Path) -> dict[str, float]:
    runs.mkdir(parents=True, exist_ok=True)
    times = {}
    jobs = {
        "old": ["--role", "old", "--setting", args.setting, "--arch", "small-cnn", "--epochs", args.epochs],
        "new": [
            "--role",
            "new",
            "--setting",
            args.setting,
            "--arch",
            args.new_arch,
            "--set",
            f"embed_dim={args.new_dim}",
            "--epochs",
            args.new_epochs,
        ],
    }
    for role, extra in jobs.items():
        if not (runs / f"{role}.pt").is_file():
            size = ["--set", "batch=64", "--set", "lr=0.05"] if args.data == "digits" else []  # as rmq demo
            _, times[role] = rmq(
                "train",
                "backbone",
                "-q",
                "--data",
                data,
                *size,
                *extra,
                "--out",
                runs / f"{role}.pt",
            )
    return times


def export_and_stamp(runs: Path, onnx: Path) -> None:
    onnx.mkdir(parents=True, exist_ok=True)
    for role in ("old", "new"):
        if not (onnx / f"{role}.onnx").is_file():
            from rm_qdrant_exporters.serving import export_backbone

            export_backbone(runs / f"{role}.pt", onnx / f"{role}-export.onnx", role=role, scores=False)
            rmq(
                "model",
                "stamp",
                onnx / f"{role}-export.onnx",
                "--out",
                onnx / f"{role}.onnx",
                "--output",
                "embedding=embedding",
                "--input-size",
                32,
                "--name",
                f"team-{role}",
            )


def gallery_pair(store: Path, name: str, images: Path, old: Path, *init: object) -> float:
    """A team's gallery: ``images`` indexed with the old model into collection NAME-gallery, paired as NAME.

    Returns the seconds ``rmq index`` took.
    """
    collection = f"{name}-gallery"
    _, seconds = rmq("index", "--collection", collection, "--data", images, "--encoder", old, store=store)
    rmq("init", "--name", name, "--old-collection", collection, *init, store=store)
    return seconds


def embed(model: Path, images: list[str], output: str) -> np.ndarray:
    return embed_outputs(model, images, [output])[output]


def embed_outputs(model: Path, images: list[str], outputs: list[str]) -> dict[str, np.ndarray]:
    """Each of ``outputs`` for every image, from one pass of the graph."""
    encoder = OnnxEncoder(model, batch_size=512)
    parts = [encoder.encode(images[i : i + 2048], outputs) for i in range(0, len(images), 2048)]
    return {name: np.concatenate([part[name] for part in parts]) for name in outputs}


def curve(q_new, q_old, g_new, g_old, labels, order, old_distance=None) -> dict[str, Any]:
    maps = [
        backfill_retrieval(
            q_new, q_old, g_new, g_old, labels, migrated_at(order, t), old_distance=old_distance
        ).map
        for t in FRACTIONS
    ]
    return {"map": maps, "auc": area(maps)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", choices=["cifar", "digits"], default="cifar")
    parser.add_argument("--epochs", type=int, default=8, help="the old backbone's epochs")
    parser.add_argument("--new-epochs", type=int, help="the new backbone's [default: --epochs]")
    parser.add_argument(
        "--setting",
        choices=["extended", "open"],
        default="extended",
        help="class split of the two backbones (rmq train backbone --setting); open: old on a seeded "
        "30 %% of the classes, new on the rest; the gallery is every training image either way",
    )
    parser.add_argument("--new-arch", default="small-cnn")
    parser.add_argument("--new-dim", type=int, default=128)
    parser.add_argument("--sample", type=int, default=20000)
    parser.add_argument("--served", action="store_true", help="also rmq eval the label-free graph")
    args = parser.parse_args(argv)
    args.new_epochs = args.new_epochs or args.epochs
    split = "-open" if args.setting == "open" else ""
    tag = f"{args.data}{split}-{args.new_arch}-{args.new_dim}-e{args.epochs}-{args.new_epochs}"
    work = ROOT / ".cache" / "fit-bench" / tag
    work.mkdir(parents=True, exist_ok=True)
    data = dataset(args.data, work.parent)
    runs, onnx, store = work / "runs", work / "onnx", work / "store"
    os.environ.setdefault("RMQ_CACHE_DIR", str(work / "cache"))
    print(f"{tag}: backbones", flush=True)
    trained = backbones(args, data, runs)
    export_and_stamp(runs, onnx)
    shutil.rmtree(store, ignore_errors=True)
    t_index = gallery_pair(
        store,
        "team",
        data / "train",
        onnx / "old.onnx",
        "--encoder",
        onnx / "new.onnx",
        "--old-encoder",
        onnx / "old.onnx",
    )
    fits = {
        "Procrustes from the pair": ["--loss", "procrustes"],
        "rmq fit, no labels": [],
        "rmq fit --label-field label": ["--label-field", "label"],
    }
    seconds, reports = {}, {}
    for name, extra in fits.items():
        out = onnx / f"fit-{len(seconds)}.onnx"
        text, seconds[name] = rmq(
            "fit",
            "--name",
            "team",
            "--backbone",
            onnx / "new.onnx",
            "--out",
            out,
            "--sample",
            args.sample,
            "--force",
            "--json",
            *extra,
            store=store,
        )
        reports[name] = json.loads(text)
    text, seconds["calibrated naive (rmq calibrate)"] = rmq(
        "calibrate", "--name", "team", "--sample", args.sample, "--force", "--json", store=store
    )
    reports["calibrated naive (rmq calibrate)"] = json.loads(text)
    with open_store(store) as opened:
        calibration = load_pair(opened, "team").old_distance
    heads = runs / "heads-mcl.pt"
    _, seconds["trainer"] = rmq(
        "train",
        "heads",
        "-q",
        "--old",
        runs / "old.pt",
        "--new",
        runs / "new.pt",
        "--data",
        data,
        "--loss",
        "mcl",
        "--out",
        heads,
    )
    # From the checkpoint: the heads were trained on its raw embeddings (the ONNX graph's are L2-normalised).
    rmq("export", "--new", runs / "new.pt", "--heads", heads, "--out", onnx / "trainer.onnx")

    print("scoring on the test images", flush=True)
    items = scan_image_folder(data / "test")
    images = [item.uri for item in items]
    labels = np.unique([item.label for item in items], return_inverse=True)[1]
    order = np.random.default_rng(0).permutation(len(items))
    old = embed(onnx / "old.onnx", images, "embedding")
    new = embed(onnx / "new.onnx", images, "embedding")
    rows = {
        "Old": curve(old, old, old, old, labels, order),
        "New": curve(new, new, new, new, labels, order),
        "RM_naive": curve(new, old, new, old, labels, order),
        "calibrated naive (rmq calibrate)": curve(new, old, new, old, labels, order, calibration),
    }
    graphs = {name: onnx / f"fit-{i}.onnx" for i, name in enumerate(fits)}
    graphs["trainer's MCL + ρ (rmq train heads)"] = onnx / "trainer.onnx"
    for name, graph in graphs.items():
        outs = embed_outputs(graph, images, ["new", "rev"])
        rows[name] = curve(outs["new"], outs["rev"], outs["new"], old, labels, order)
    a_old, a_new = rows["Old"]["auc"], rows["New"]["auc"]
    for row in rows.values():
        row["gain"] = gain(row["auc"], a_old, a_new)
        row["never_falls"] = all(m >= row["map"][0] - 1e-6 for m in row["map"])  # float noise of a flat curve
    served = None
    if args.served:
        gallery_pair(
            store, "served", data / "test", onnx / "old.onnx", "--encoder", graphs["rmq fit, no labels"]
        )
        text, _ = rmq("eval", "--name", "served", "--queries", data / "test", "--json", store=store)
        served = json.loads(text)
    write(args, tag, rows, seconds, reports, trained, t_index, served)


def write(args, tag, rows, seconds, reports, trained, t_index, served) -> None:
    date = datetime.date.today().isoformat()
    command = "python benchmarks/fit_table.py " + " ".join(sys.argv[1:])
    lines = [
        f"# rmq fit through the team path: {tag}",
        "",
        f"- Command: `{command.strip()}`",
        f"- Machine: {machine()}; date {date}",
        f"- Gallery for fitting: the {args.data} training images indexed with the old model "
        f"({t_index:.0f} s); `rmq fit --sample {args.sample}` drew from it",
        "- Scored on the test images (each a query against the other test images), random order, 11 points; "
        "Gain = (AUC − AUC_Old) / (AUC_New − AUC_Old)",
        f"- Backbones trained here: {', '.join(f'{k} {v:.0f} s' for k, v in trained.items()) or 'cached'}",
        "",
        "| row | AUC_mAP | Gain | mAP t=0 | t=0.5 | t=1 | never falls | command time (s) | holdout check |",
        "|---|--:|--:|--:|--:|--:|:-:|--:|:-:|",
    ]
    for name, row in rows.items():
        m = row["map"]
        spent = seconds.get(name, seconds.get("trainer") if name.startswith("trainer") else None)
        report = reports.get(name, {})
        # rmq calibrate says why it keeps no map ("refused"); rmq fit whether the graph beat the naive merge
        check = kept_without_force(report)
        lines.append(
            f"| {name} | {100 * row['auc']:.1f} | {100 * row['gain']:.0f} % | {100 * m[0]:.1f} | "
            f"{100 * m[5]:.1f} | {100 * m[-1]:.1f} | {'yes' if row['never_falls'] else 'no'} | "
            f"{'' if spent is None else f'{spent:.0f}'} | "
            f"{'' if check is None else 'passed' if check else 'failed (--force)'} |"
        )
    lines += [
        "",
        "Command time: the whole `rmq` process (sampling, fetching and embedding the images, training, "
        "the holdout forecast, export); the trainer's row is `rmq train heads` alone. Holdout check: whether "
        "`rmq fit` / `rmq calibrate` found the result better than the naive merge on its held-out points "
        "(every row here ran with --force so that all are scored).",
    ]
    lines += ["", "mAP_t (%) at t = 0, 0.1, …, 1:", ""]
    lines += [f"- {name}: " + " ".join(f"{100 * v:.1f}" for v in row["map"]) for name, row in rows.items()]
    if served is not None:
        lines += [
            "",
            f"Served (`rmq eval`, label-free graph on the test gallery): AUC_mAP "
            f"{100 * served['auc_map']:.1f}, mAP "
            + " ".join(f"{100 * p['map']:.1f}" for p in served["points"]),
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "benchmarks" / "results" / f"fit-{tag}"
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "command": command,
                "date": date,
                "machine": machine(),
                "rows": rows,
                "seconds": seconds,
                "trained": trained,
                "index_seconds": t_index,
                "fit_reports": reports,
                "served": served,
            },
            indent=1,
            default=float,
        )
    )


if __name__ == "__main__":
    main()
