"""The heads' training schedule on a small data set: old defaults against new, by Gain.

On scikit-learn's digits split as ``rmq demo`` writes it (``rm_qdrant_train.demo.write_digits``,
about 1,260 training images), with the demo's old and new backbones (12 epochs, batch
64, lr 0.05; old on digits 0-4, new on all ten), this trains MCL + ρ heads under each
schedule below and several seeds, and scores each offline over the test images (each a
query against the others, seeded random backfill order, t = 0, 0.1, …, 1): AUC_mAP and
Gain = (AUC − AUC_Old) / (AUC_New − AUC_Old). It prints a Markdown table with the
command, the machine and the date.

Run: ``python benchmarks/heads_schedule.py [--seeds 0,1] [--out DIR]``
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from rm_qdrant.caches import CACHE_ENV
from rm_qdrant.core.metrics import retrieval
from rm_qdrant.core.offline import BackfillEmbeddings, backfill_table
from rm_qdrant_train.backbone import train_backbone
from rm_qdrant_train.cache import embeddings
from rm_qdrant_train.config import BackboneConfig, HeadsConfig
from rm_qdrant_train.demo import write_digits
from rm_qdrant_train.heads import load_heads, steps_per_epoch, train_heads

#: name -> HeadsConfig settings; "old defaults" are the settings before the step-sized schedule.
SCHEDULES: dict[str, dict[str, object]] = {
    "old defaults (50 epochs, batch 512, lr 1e-4)": {"epochs": 50, "batch": 512, "lr": 1e-4},
    "demo (60 epochs, batch 256, lr 1e-3)": {"epochs": 60, "batch": 256, "lr": 1e-3},
    "1000 steps, batch 256, lr 1e-3": {"steps": 1000, "batch": 256, "lr": 1e-3},
    "**new defaults (3000 steps, batch 256, lr 1e-3)**": {},
}


def machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, {os.cpu_count()} CPU cores"
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    return (
        f"{os.cpu_count()}-core {model or platform.processor() or 'CPU'}, no GPU, torch {torch.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".cache/heads_schedule"), help="work folder")
    parser.add_argument("--seeds", default="0,1", help="heads seeds, comma-separated")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    os.environ.setdefault(CACHE_ENV, str(args.out / "cache"))
    root = args.out / "digits"
    if not (root / "train").is_dir():
        write_digits(root)
    runs = args.out / "runs"
    for role in ("old", "new"):  # as rm_qdrant_train.demo.run_demo trains them
        if not (runs / f"{role}.pt").is_file():
            train_backbone(
                BackboneConfig(
                    data=str(root), out=str(runs / f"{role}.pt"), role=role, epochs=12, batch=64, lr=0.05
                )
            )
    test = root / "test"
    old, new = embeddings(runs / "old.pt", test), embeddings(runs / "new.pt", test)
    labels = old.labels
    r_old, r_new = retrieval(old.emb, old.emb, labels), retrieval(new.emb, new.emb, labels)
    order = np.random.default_rng(0).permutation(len(labels))
    n_train = len(embeddings(runs / "new.pt", root / "train").labels)
    rows = []
    for name, settings in SCHEDULES.items():
        aucs, gains, seconds = [], [], []
        cfg = HeadsConfig(**settings)  # type: ignore[arg-type]
        per_epoch = steps_per_epoch(n_train, cfg.batch)
        steps = cfg.epochs * per_epoch if cfg.epochs else cfg.steps
        for seed in seeds:
            out = runs / f"heads-{len(rows)}-s{seed}.pt"
            cfg = HeadsConfig(
                old=str(runs / "old.pt"),
                new=str(runs / "new.pt"),
                data=str(root),
                out=str(out),
                seed=seed,
                **settings,  # type: ignore[arg-type]
            )
            started = time.perf_counter()
            train_heads(cfg)
            seconds.append(time.perf_counter() - started)
            heads, _ = load_heads(out)
            with torch.no_grad():
                q_new, q_rev = (t.numpy() for t in heads(torch.from_numpy(new.emb)))
            methods = {"rm": BackfillEmbeddings(q_new, q_rev, q_new, old.emb, labels)}
            row = backfill_table(methods, order, old=r_old, new=r_new)[0]
            aucs.append(row.curve.auc_map)
            gains.append(row.gain_map)
        rows.append((name, steps, aucs, gains, statistics.mean(seconds)))
        print(f"{name}: Gain {' '.join(f'{100 * g:.0f} %' for g in gains)}", file=sys.stderr, flush=True)

    def spread(values: list[float]) -> str:
        mean = 100 * statistics.mean(values)
        return f"{mean:.1f} ± {100 * statistics.stdev(values):.1f}" if len(values) > 1 else f"{mean:.1f}"

    print("# Heads schedule on a small data set (digits, MCL + ρ)\n")
    print(f"- Command: `python {' '.join(sys.argv)}`")
    print(f"- Machine: {machine()}; date {datetime.date.today().isoformat()}")
    print(
        f"- Data: scikit-learn digits as `rmq demo` writes them: {n_train} training images (heads train on "
        f"all, the new model knows every class), {len(labels)} test images; backbones as the demo trains "
        f"them: old mAP {100 * r_old.map:.1f} %, new {100 * r_new.map:.1f} % (test, full ranking)"
    )
    spread_note = "; mean ± standard deviation over the seeds" if len(seeds) > 1 else ""
    print(f"- Heads: MCL + ρ, τ 0.1, hard mining, Adam with cosine decay; seeds {args.seeds}{spread_note}")
    print(
        "- Scoring: every test image a query against the others, random backfill order (seeded), "
        "Gain = (AUC_mAP − AUC_Old) / (AUC_New − AUC_Old)\n"
    )
    print("| schedule | Adam steps | AUC_mAP (%) | Gain (%) | training (s) |")
    print("|---|--:|--:|--:|--:|")
    for name, steps, aucs, gains, secs in rows:
        print(f"| {name} | {steps} | {spread(aucs)} | {spread(gains)} | {secs:.0f} |")


if __name__ == "__main__":
    main()
