"""CIFAR-10, extended-class: backbones, then ψ/ρ heads with each loss, evaluated offline.

Trains (or reuses, when the checkpoints exist) an old backbone on the first five
classes and a new one on all ten, then trains heads with RQT, CL-S, CL-M and MCL
(ρ learned) and MCL with ρ = identity, timing each, and prints the retrieval mAP
and top-1 over the 10,000 test images at backfill fractions t = 0, 0.5 and 1
(random order, seeded), beside the Old, New and RM_naive systems.

Run: ``python benchmarks/train_cifar.py [--epochs 10] [--head-epochs 50] [--arch small-cnn]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cifar import ROOT, cifar_root  # noqa: E402

from rm_qdrant.core.metrics import backfill_retrieval, migrated_at, retrieval  # noqa: E402
from rm_qdrant_train.backbone import train_backbone  # noqa: E402
from rm_qdrant_train.cache import embeddings  # noqa: E402
from rm_qdrant_train.config import BackboneConfig, HeadsConfig  # noqa: E402
from rm_qdrant_train.heads import load_heads, train_heads  # noqa: E402

FRACTIONS = (0.0, 0.5, 1.0)


def backbones(args: argparse.Namespace, runs: Path) -> tuple[Path, Path, dict[str, float]]:
    paths, top1 = {}, {}
    for role in ("old", "new"):
        path = runs / f"{role}.pt"
        if not path.is_file():
            cfg = BackboneConfig(
                data=str(cifar_root()),
                out=str(path),
                arch=args.arch,
                role=role,
                epochs=args.epochs,
                batch=args.batch,
                lr=args.lr,
                seed=args.seed,
            )
            started = time.perf_counter()
            train_backbone(cfg)
            print(f"trained {role} backbone in {time.perf_counter() - started:.0f} s", flush=True)
        paths[role] = path
        top1[role] = torch.load(path, map_location="cpu", weights_only=True)["metric"]["top1"]
    return paths["old"], paths["new"], top1


def curve(q_new, q_old, g_new, g_old, labels, order) -> list[tuple[float, float]]:
    points = []
    for t in FRACTIONS:
        migrated = migrated_at(order, t)
        r = backfill_retrieval(q_new, q_old, g_new, g_old, labels, migrated)
        points.append((r.map, r.top1))
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="small-cnn")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--head-epochs", type=int, default=50)
    parser.add_argument("--head-lr", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, default=0.1)
    parser.add_argument("--losses", default="rqt,cl-s,cl-m,mcl,mcl-no-rho")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-reference", action="store_true", help="skip the Old, New and RM_naive rows")
    args = parser.parse_args()
    runs = ROOT / ".cache" / "runs" / f"extended-{args.arch}-e{args.epochs}-s{args.seed}"
    old_ckpt, new_ckpt, top1 = backbones(args, runs)
    test = cifar_root() / "test"
    old, new = embeddings(old_ckpt, test), embeddings(new_ckpt, test)
    labels = new.labels
    order = np.random.default_rng(args.seed).permutation(len(labels))
    rows = []
    if not args.no_reference:
        offline_old, offline_new = retrieval(old.emb, old.emb, labels), retrieval(new.emb, new.emb, labels)
        rows += [
            ("Old (old/old)", [(offline_old.map, offline_old.top1)] * 3, 0.0),
            ("New (new/new)", [(offline_new.map, offline_new.top1)] * 3, 0.0),
            ("RM_naive", curve(new.emb, old.emb, new.emb, old.emb, labels, order), 0.0),
        ]
    for name in args.losses.split(","):
        loss, learn_rho = name.removesuffix("-no-rho"), not name.endswith("-no-rho")
        tag = f"{name}-t{args.temperature}-lr{args.head_lr}-e{args.head_epochs}"
        cfg = HeadsConfig(
            old=str(old_ckpt),
            new=str(new_ckpt),
            data=str(cifar_root()),
            out=str(runs / f"heads-{tag}.pt"),
            loss=loss,
            learn_rho=learn_rho,
            epochs=args.head_epochs,
            lr=args.head_lr,
            temperature=args.temperature,
            seed=args.seed,
        )
        started = time.perf_counter()
        train_heads(cfg)
        seconds = time.perf_counter() - started
        heads, _ = load_heads(cfg.out)
        with torch.no_grad():
            q_new, q_rev = (t.numpy() for t in heads(torch.from_numpy(new.emb)))
        rows.append((f"RM {name}", curve(q_new, q_rev, q_new, old.emb, labels, order), seconds))
        print(f"trained heads {name} in {seconds:.0f} s", flush=True)

    print(f"\ncommand: python {' '.join(sys.argv)}")
    print(
        f"backbones: {args.arch}, {args.epochs} epochs; test top-1 old {top1['old']:.3f} (5 classes), "
        f"new {top1['new']:.3f} (10 classes); heads: {args.head_epochs} epochs, Adam lr {args.head_lr}, "
        f"τ {args.temperature}, batch 512, hard mining\n"
    )
    print("| system | mAP t=0 | mAP t=0.5 | mAP t=1 | top-1 t=0 / 0.5 / 1 | head training (s) |")
    print("|---|--:|--:|--:|--:|--:|")
    for name, points, seconds in rows:
        maps = " | ".join(f"{100 * m:.1f}" for m, _ in points)
        tops = " / ".join(f"{100 * t:.1f}" for _, t in points)
        print(f"| {name} | {maps} | {tops} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
