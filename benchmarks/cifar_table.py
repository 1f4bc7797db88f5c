"""CIFAR-10: the paper's table and curves for every method, offline, in one command.

For each setting (extended: old on 5 classes, new on all 10; open: old on a seeded
3 classes, new on the other 7) this trains, or reuses from ``.cache/runs/``:
the old and new backbones, the BCT and RACT new backbones, ψ with RQT, CL-S and MCL
(ρ = identity), CL-M + ρ (with ρ fixed, CL-M's new-system term is a constant and CL-M
equals CL-S), and MCL + ρ (RM full), the Procrustes, low-rank and
residual-MLP adapters, FCT's transformation with and without side-information and
BiCT's. It scores every method over the 10,000 test images (each a query against
the other 9,999) at t = 0, 0.1, …, 1 along a random backfill order, then RM_naive
and RM full along the four orders, and writes ``cifar-SETTING-ARCH.{md,json,png}``
into ``--out`` with the command, the machine and the date.

Presets (``--preset``, default: gpu when CUDA is present, else cpu) size the run:
``gpu`` trains 20-epoch backbones on all images (and adds ResNet-18 with
``--arch resnet18``); ``cpu`` trains 6-epoch backbones on 10,000 images each and
20-epoch heads, to finish both settings in about an hour on 2 cores. A rerun
reuses every trained file and only re-scores.

Run: ``python benchmarks/cifar_table.py [--settings extended,open] [--preset cpu|gpu]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cifar import ROOT, cifar_root  # noqa: E402

from rm_qdrant.core.metrics import retrieval  # noqa: E402
from rm_qdrant.core.offline import (  # noqa: E402
    BackfillEmbeddings,
    Row,
    as_json,
    backfill_table,
    markdown,
    plot,
    reference_rows,
)
from rm_qdrant.core.ordering import order_keys  # noqa: E402
from rm_qdrant_train.adapter_job import load_adapter, train_adapter_job  # noqa: E402
from rm_qdrant_train.backbone import train_backbone  # noqa: E402
from rm_qdrant_train.baselines import BaselineConfig, baseline_embeddings, train_baseline  # noqa: E402
from rm_qdrant_train.cache import embeddings, file_hash  # noqa: E402
from rm_qdrant_train.checkpoints import load_checkpoint  # noqa: E402
from rm_qdrant_train.config import AdapterConfig, BackboneConfig, HeadsConfig  # noqa: E402
from rm_qdrant_train.heads import load_heads, train_heads  # noqa: E402

PRESETS: dict[str, dict[str, Any]] = {
    "gpu": {"epochs": 20, "limit": 0, "head_epochs": 50, "adapter_epochs": 50, "fct_epochs": 30},
    "cpu": {"epochs": 6, "limit": 10_000, "head_epochs": 20, "adapter_epochs": 20, "fct_epochs": 15},
    "smoke": {"epochs": 1, "limit": 0, "head_epochs": 1, "adapter_epochs": 1, "fct_epochs": 1},  # tests
}
HEADS = {  # row name → (loss, learn ρ)
    "RM ψ:RQT": ("rqt", False),
    "RM ψ:CL-S": ("cl-s", False),
    "RM CL-M + ρ": ("cl-m", True),  # with ρ = identity CL-M's new-system term is constant: CL-M = CL-S
    "RM ψ:MCL": ("mcl", False),
    "RM full (MCL + ρ)": ("mcl", True),
}
ADAPTERS = {
    "Procrustes adapter": "procrustes",
    "low-rank adapter": "low-rank",
    "residual-MLP adapter": "residual-mlp",
}
ORDERS = ("random", "confidence", "centroid", "centroid-unsupervised")
OLD_DIM = 128  # the old backbone's embedding size (BackboneConfig's default)


class Runs:
    """One folder of trained files; ``make`` trains a missing one and records its seconds and machine."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.log = folder / "timings.json"
        self.trained: dict[str, dict[str, Any]] = (
            json.loads(self.log.read_text()) if self.log.is_file() else {}
        )

    def make(self, name: str, train: Callable[[Path], object]) -> Path:
        path = self.folder / name
        if not path.is_file():
            started = time.perf_counter()
            train(path)
            self.trained[name] = {"seconds": time.perf_counter() - started, "machine": machine()}
            self.log.write_text(json.dumps(self.trained, indent=2))
            print(f"  trained {name} in {self.trained[name]['seconds']:.0f} s", flush=True)
        return path

    def summary(self) -> str:
        """Seconds of training per machine, e.g. "412 s on NVIDIA H200 ..., 1800 s on 2-core ..."."""
        per: dict[str, float] = {}
        for entry in self.trained.values():
            per[entry["machine"]] = per.get(entry["machine"], 0.0) + entry["seconds"]
        return "; ".join(f"{seconds:.0f} s on {where}" for where, seconds in per.items()) or "none recorded"


def train_all(setting: str, args: argparse.Namespace, p: dict[str, Any], runs: Runs) -> dict[str, Path]:
    """Every trained file of one setting, by row name (backbones by role); missing ones are trained."""
    data = str(args.data)
    backbone = {
        "arch": args.arch,
        "setting": setting,
        "epochs": p["epochs"],
        "limit": p["limit"],
        "seed": args.seed,
    }

    upgrade = {"arch": args.new_arch, "embed_dim": args.new_dim, "epochs": args.new_epochs or p["epochs"]}

    def backbone_job(role: str, **changes: Any) -> Callable[[Path], object]:
        settings = {**backbone, **changes}
        return lambda out: train_backbone(BackboneConfig(data=data, out=str(out), role=role, **settings))

    # A heterogeneous upgrade keeps the homogeneous run's old model (trained there when missing).
    old_runs = Runs(Path(args.runs) / tag(setting, args, p, hetero=False)) if heterogeneous(args) else runs
    files = {
        "old": old_runs.make("old.pt", backbone_job("old")),
        "new": runs.make("new.pt", backbone_job("new", **upgrade)),
    }
    old, new = str(files["old"]), str(files["new"])

    def baseline_job(method: str, **settings: Any) -> Callable[[Path], object]:
        def job(out: Path) -> object:
            cfg = BaselineConfig(data=data, old=old, out=str(out), seed=args.seed, **settings)
            return train_baseline(method, cfg)

        return job

    same_width = args.new_dim == OLD_DIM  # BCT and RACT compare new queries with old vectors directly
    for method in ("bct", "ract") if same_width else ():
        files[method] = runs.make(f"{method}.pt", baseline_job(method, backbone={**backbone, "role": "new"}))
    if args.stage == "backbones":
        return files

    def heads_job(loss: str, rho: bool) -> Callable[[Path], object]:
        e = p["head_epochs"]
        return lambda out: train_heads(
            HeadsConfig(
                old=old, new=new, data=data, out=str(out), loss=loss, learn_rho=rho, epochs=e, seed=args.seed
            )
        )

    for name, (loss, rho) in HEADS.items():
        files[name] = runs.make(heads_file(loss, rho, p["head_epochs"]), heads_job(loss, rho))

    def adapter_job(kind: str) -> Callable[[Path], object]:
        e = p["adapter_epochs"]
        return lambda out: train_adapter_job(
            AdapterConfig(old=old, new=new, data=data, out=str(out), kind=kind, epochs=e, seed=args.seed)
        )

    for name, kind in ADAPTERS.items():
        files[name] = runs.make(adapter_file(kind, p["adapter_epochs"]), adapter_job(kind))
    # The side-information autoencoder is label-free and model-free: one per data set and preset.
    side = {"side": str(old_runs.folder / "side.pt"), "limit": p["limit"], "epochs": p["fct_epochs"]}
    files["FCT"] = runs.make("fct.pt", baseline_job("fct", new=new, side_info=True, **side))
    files["FCT (no side-info)"] = runs.make(
        "fct-noside.pt", baseline_job("fct", new=new, side_info=False, **side)
    )
    if same_width:
        files["BiCT"] = runs.make("bict.pt", baseline_job("bict", new=str(files["bct"]), **side))
    return files


def heterogeneous(args: argparse.Namespace) -> bool:
    return args.new_arch != args.arch or args.new_dim != OLD_DIM


def tag(setting: str, args: argparse.Namespace, p: dict[str, Any], *, hetero: bool) -> str:
    """The runs folder's name: everything that changes what is trained."""
    upgrade = f"-to-{args.new_arch}-{args.new_dim}d-e{args.new_epochs or p['epochs']}" if hetero else ""
    return f"{setting}-{args.arch}{upgrade}-e{p['epochs']}-n{p['limit']}-s{args.seed}"


def heads_file(loss: str, rho: bool, epochs: int) -> str:
    return f"heads-{loss}{'' if rho else '-no-rho'}-e{epochs}.pt"


def adapter_file(kind: str, epochs: int) -> str:
    return f"adapter-{kind}-e{epochs}.pt"


def rm_methods(files: dict[str, Path], old: Any, new: Any) -> dict[str, BackfillEmbeddings]:
    """RM_naive, the ψ/ρ heads and the adapters: the methods that merge an old and a new collection."""
    labels = new.labels
    methods = {"RM_naive": BackfillEmbeddings(new.emb, old.emb, new.emb, old.emb, labels)}
    with torch.no_grad():
        for name in HEADS:
            heads, _ = load_heads(files[name])
            q_new, q_rev = (x.numpy() for x in heads(torch.from_numpy(new.emb)))
            methods[name] = BackfillEmbeddings(q_new, q_rev, q_new, old.emb, labels)
        for name in ADAPTERS:
            adapter, _ = load_adapter(files[name])
            q_rev = adapter(torch.from_numpy(new.emb)).numpy()
            methods[name] = BackfillEmbeddings(new.emb, q_rev, new.emb, old.emb, labels)
    return methods


def served(files: dict[str, Path], test: Path) -> tuple[dict[str, BackfillEmbeddings], Any, Any]:
    """What each method serves on the test set, and the old and new models' embeddings of it."""
    old, new = embeddings(files["old"], test), embeddings(files["new"], test)
    methods = rm_methods(files, old, new)
    for name, method in (("BCT", "bct"), ("RACT", "ract")):
        if method in files:
            methods[name] = baseline_embeddings(method, test, old=files["old"], new=files[method])
    for name, method, target in (
        ("FCT", "fct", "new"),
        ("FCT (no side-info)", "fct", "new"),
        ("BiCT", "bict", "bct"),
    ):
        if name in files:
            methods[name] = baseline_embeddings(
                method, test, old=files["old"], new=files[target], transformation=files[name]
            )
    return methods, old, new


#: The trained files each row depends on, beside the old and new backbones.
SOURCES = {
    **{name: [name] for name in [*HEADS, *ADAPTERS]},
    "BCT": ["bct"],
    "RACT": ["ract"],
    "FCT": ["FCT"],
    "FCT (no side-info)": ["FCT (no side-info)"],
    "BiCT": ["bct", "BiCT"],
}


class Scores:
    """Scored rows kept in ``scores.json``, keyed by the test folder, order and the hashes of their files."""

    def __init__(self, path: Path, files: dict[str, Path], data: str) -> None:
        self.path, self.files, self.data = path, files, data
        self.saved: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.is_file() else {}

    def key(self, name: str, order: str) -> str:
        used = ["old", "new", *SOURCES.get(name, [])]
        return "|".join([self.data, order, name, *(file_hash(self.files[u]) for u in used)])

    def row(self, name: str, order: str, compute: Callable[[], Row], report: Callable[[Row], None]) -> Row:
        key = self.key(name, order)
        if key in self.saved:
            row = Row.from_dict(self.saved[key])
        else:
            row = compute()
            self.saved[key] = row.as_dict()
            self.path.write_text(json.dumps(self.saved))
        report(row)
        return row


def backfill_order(spec: str, old: Any) -> np.ndarray:
    """Test-set indices in migration order, as rm-qdrant would move them (old model's view)."""
    payloads = [
        {"label": str(y), "old_confidence": float(c)} for y, c in zip(old.labels, old.scores(), strict=True)
    ]
    keys = order_keys(spec, list(range(len(old.labels))), payloads, old.emb)
    return np.argsort(keys, kind="stable")


def goals(rows: dict[str, Row], orders: dict[str, dict[str, Row]]) -> list[str]:
    """The issue's goals, each with its measured value."""
    naive, full, new, mcl = (rows[n].curve for n in ("RM_naive", "RM full (MCL + ρ)", "New", "RM ψ:MCL"))
    cl_s, cl_m = rows["RM ψ:CL-S"].curve, rows["RM CL-M + ρ"].curve
    gain = rows["RM full (MCL + ρ)"].gain_map
    others = [r for n, r in rows.items() if n not in ("Old", "New", "RM full (MCL + ρ)") and "ψ" not in n]
    best = max(others, key=lambda r: r.curve.auc_map)
    by_order = {o: orders[o]["RM_naive"].curve.auc_map for o in ORDERS}

    def mark(ok: bool) -> str:
        return "met" if ok else "missed"

    return [
        f"RM_naive never falls: {mark(naive.monotone())}; "
        f"mAP_1 {pct(naive.maps[-1])} (New {pct(new.maps[-1])})",
        f"RM full Gain ≥ 120 %: {mark(gain >= 1.2)} ({100 * gain:.0f} %)",
        f"RM full never falls: {mark(full.monotone())}",
        f"RM full mAP_1 ≥ New's + 10: {mark(full.maps[-1] >= new.maps[-1] + 0.1)} "
        f"({pct(full.maps[-1])} vs {pct(new.maps[-1])})",
        f"RM full ahead of every baseline and adapter in AUC_mAP: {mark(full.auc_map > best.curve.auc_map)} "
        f"({pct(full.auc_map)}; best other: {best.name}, {pct(best.curve.auc_map)})",
        "MCL ahead of CL-S (ψ only) and MCL + ρ ahead of CL-M + ρ in AUC_mAP: "
        f"{mark(mcl.auc_map > cl_s.auc_map and full.auc_map > cl_m.auc_map)} (MCL {pct(mcl.auc_map)} vs CL-S "
        f"{pct(cl_s.auc_map)}; MCL + ρ {pct(full.auc_map)} vs CL-M + ρ {pct(cl_m.auc_map)}); never falls: "
        f"MCL {mcl.monotone()}, MCL + ρ {full.monotone()}, CL-S {cl_s.monotone()}, "
        f"CL-M + ρ {cl_m.monotone()}",
        "confidence or centroid ahead of random for RM_naive in AUC_mAP: "
        f"{mark(max(by_order['confidence'], by_order['centroid']) > by_order['random'])} ("
        + ", ".join(f"{o} {pct(a)}" for o, a in by_order.items())
        + ")",
    ]


def machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (CUDA, bf16 autocast), {os.cpu_count()} CPU cores"
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "CPU",
    )
    return f"{os.cpu_count()}-core {model}, no GPU"


def run_setting(setting: str, args: argparse.Namespace, preset: str) -> None:
    p = {**PRESETS[preset], **{k: v for k, v in vars(args).items() if k in PRESETS[preset] and v is not None}}
    hetero = heterogeneous(args)
    folder = tag(setting, args, p, hetero=hetero)
    print(f"\n== {setting}: {folder}", flush=True)
    runs = Runs(Path(args.runs) / folder)
    started = time.perf_counter()
    files = train_all(setting, args, p, runs)
    trained = time.perf_counter() - started
    if args.stage == "backbones":
        return
    methods, old, new = served(files, Path(args.data) / "test")
    r_old, r_new = retrieval(old.emb, old.emb, old.labels), retrieval(new.emb, new.emb, new.labels)

    def print_row(r: Row) -> None:
        print(f"  {r.name}: AUC_mAP {pct(r.curve.auc_map)}, Gain {100 * r.gain_map:.0f} %", flush=True)

    cache = Scores(runs.folder / "scores.json", files, args.data)

    def score(names: list[str], spec: str) -> dict[str, Row]:
        order = backfill_order(spec, old)

        def compute(name: str) -> Callable[[], Row]:
            return lambda: backfill_table({name: methods[name]}, order, old=r_old, new=r_new)[0]

        return {n: cache.row(n, spec, compute(n), print_row) for n in names}

    rows = reference_rows(r_old, r_new) + list(score(list(methods), "random").values())
    orders = {spec: score(["RM_naive", "RM full (MCL + ρ)"], spec) for spec in ORDERS}
    by_name = {r.name: r for r in rows}
    scored = time.perf_counter() - started - trained
    top1 = {
        role: load_checkpoint(files[role], "backbone")["metric"]["top1"]
        for role in ("old", "new", "bct", "ract")
        if role in files
    }

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models = f"{args.arch}-to-{args.new_arch}-{args.new_dim}d" if hetero else args.arch
    stem = out / f"cifar-{setting}-{models}"
    command = args.command
    header = {
        "setting": setting,
        "arch": args.arch,
        "new_arch": args.new_arch,
        "new_dim": args.new_dim,
        "preset": preset,
        "settings": p,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "command": command,
        "backbone_top1": top1,
        "trained": runs.trained,
        "this_run": {"training_s": trained, "scoring_s": scored},
    }
    checks = goals(by_name, orders)
    stem.with_suffix(".json").write_text(
        json.dumps(
            {
                **header,
                "order": "random",
                "rows": as_json(rows),
                "orders": {o: as_json(list(r.values())) for o, r in orders.items()},
                "goals": checks,
            },
            indent=2,
        )
    )
    png = plot(rows, stem.with_suffix(".png"), title=f"CIFAR-10 {setting}-class, {models}, random order")
    split = (
        "old: first 5 classes, new: all 10"
        if setting == "extended"
        else "old: a seeded 3 classes, new: the other 7"
    )
    lines = [
        f"# CIFAR-10 {setting}-class ({split}), {models}: every method, offline",
        "",
        f"- Command: `{command}` (preset `{preset}`: {p['epochs']}-epoch backbones on "
        f"{p['limit'] or 'all'} training images each, {p['head_epochs']}-epoch heads, "
        f"{p['adapter_epochs']}-epoch adapters, "
        f"{p['fct_epochs']}-epoch FCT/BiCT transformations)",
        f"- Machine: {machine()}; date {header['date']}",
        "- Backbone test top-1 on their own classes: "
        + ", ".join(f"{role} {pct(value)} %" for role, value in top1.items()),
        *(
            [
                f"- Heterogeneous upgrade: old {args.arch} ({OLD_DIM}-d), new {args.new_arch} "
                f"({args.new_dim}-d, {args.new_epochs or p['epochs']} epochs). BCT, RACT, BiCT need one size "
                "(their new queries meet old vectors directly), so they have no row here."
            ]
            if hetero
            else []
        ),
        f"- Training: {runs.summary()} (per file in the JSON; "
        f"{trained:.0f} s of wall time in this run); scoring {scored:.0f} s in this run (rows already in "
        "scores.json are not scored again)",
        "- mAP and top-1 over the 10,000 test images, each query against the other 9,999; "
        "backfill order random (seeded); Gain = (AUC − AUC_Old) / (AUC_New − AUC_Old).",
        "",
        markdown(rows),
        "## Backfill order (AUC_mAP %, Gain)",
        "",
        "| order | RM_naive | RM full (MCL + ρ) |",
        "|---|--:|--:|",
    ]
    for spec, r in orders.items():
        cells = " | ".join(f"{pct(x.curve.auc_map)} ({100 * x.gain_map:.0f} %)" for x in r.values())
        lines.append(f"| {spec} | {cells} |")
    lines += ["", "## Goals (issue 6)", ""] + [f"- {c}" for c in checks]
    if png is not None:
        lines += ["", f"![curves]({png.name})"]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(checks))
    print(f"wrote {stem}.md, .json" + (", .png" if png else ""), flush=True)


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="extended,open")
    parser.add_argument("--arch", default="small-cnn", help="small-cnn | resnet18 (use a GPU)")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="default: gpu with CUDA, else cpu")
    parser.add_argument("--epochs", type=int, help="backbone epochs (overrides the preset)")
    parser.add_argument("--limit", type=int, help="training images per backbone, 0 for all (overrides)")
    parser.add_argument("--head-epochs", dest="head_epochs", type=int)
    parser.add_argument("--new-arch", help="the new model's architecture (default: --arch)")
    parser.add_argument("--new-dim", type=int, default=OLD_DIM, help="the new model's embedding size")
    parser.add_argument("--new-epochs", type=int, help="the new model's epochs (default: the preset's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--stage",
        choices=("all", "backbones"),
        default="all",
        help="backbones: train the four backbones, stop",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument(
        "--data", help="ImageFolder with train/ and test/ (default: CIFAR-10 from ../shared/data)"
    )
    parser.add_argument("--runs", default=str(ROOT / ".cache" / "runs"), help="where trained files are kept")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="  %(message)s")
    args.command = " ".join(["python benchmarks/cifar_table.py", *(sys.argv[1:] if argv is None else argv)])
    args.data = args.data or str(cifar_root())
    args.new_arch = args.new_arch or args.arch
    preset = args.preset or ("gpu" if torch.cuda.is_available() else "cpu")
    for setting in args.settings.split(","):
        run_setting(setting, args, preset)


if __name__ == "__main__":
    main()
