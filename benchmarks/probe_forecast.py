"""Does the label-free forecast (``rmq probe``) rise and fall with the labelled truth, and what does it cost?

Three parts, each printing its figures:

- ``cifar``: for every RM-style method of ``benchmarks/cifar_table.py``'s extended-class
  run (RM_naive, the ψ/ρ heads, the adapters), the forecast on a 2,000-image sample of
  the test set (recall@10 against the new model's neighbours, no labels) beside that
  method's labelled mAP_t over all 10,000 test images from the table's JSON; Spearman
  rank correlation over the 11 points, and whether both see a dip below t = 0.
- ``cost``: ``rmq probe --sample 2000`` timed as a process on a CIFAR-10 pair (the test
  set indexed with the exported old small CNN, the MCL + ρ graph as the encoder).
- ``digits``: ``rmq demo`` (scikit-learn's digits, served mAP@100 at each t), then a fresh
  index of the same gallery probed in the demo's confidence order; correlation per mode.

Run: ``python benchmarks/probe_forecast.py [--parts cifar,cost,digits]`` (after cifar_table.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cifar import ROOT, cifar_root  # noqa: E402
from cifar_table import ADAPTERS, HEADS, PRESETS, adapter_file, heads_file, rm_methods  # noqa: E402

from rm_qdrant.core.forecast import forecast  # noqa: E402
from rm_qdrant.core.ordering import order_keys  # noqa: E402
from rm_qdrant_train.cache import embeddings  # noqa: E402

RUNS = ROOT / ".cache" / "runs" / "extended-small-cnn-e20-n0-s0"
TABLE = ROOT / "benchmarks" / "results" / "cifar-extended-small-cnn.json"
RMQ = [str(Path(sys.executable).with_name("rmq"))]  # the console script beside this interpreter


def dips(curve: list[float], tolerance: float) -> bool:
    return any(v < curve[0] - tolerance for v in curve[1:])


def compare(name: str, forecast_curve: list[float], truth: list[float]) -> dict[str, object]:
    rho = float(spearmanr(forecast_curve, truth).statistic)
    row = {
        "method": name,
        "spearman": rho,
        "forecast_dips": dips(forecast_curve, 0.005),
        "truth_dips": dips(truth, 1e-4),
        "forecast": [round(v, 4) for v in forecast_curve],
        "truth": [round(v, 4) for v in truth],
    }
    yes = {True: "yes", False: "no"}
    curves = f"{' '.join(f'{v:.2f}' for v in forecast_curve)} | {' '.join(f'{100 * v:.1f}' for v in truth)}"
    print(
        f"| {name} | {rho:.2f} | {yes[row['forecast_dips']]} | {yes[row['truth_dips']]} | {curves} |",
        flush=True,
    )
    return row


def header(truth: str) -> None:
    print(
        f"| method | Spearman | forecast dips | truth dips | forecast recall@10, t = 0…1 | {truth}, t = 0…1 |"
    )
    print("|---|--:|:-:|:-:|---|---|")


def cifar_part(sample: int, seed: int) -> list[dict[str, object]]:
    test = cifar_root() / "test"
    old, new = embeddings(RUNS / "old.pt", test), embeddings(RUNS / "new.pt", test)
    table = {r["name"]: r["map"] for r in json.loads(TABLE.read_text())["rows"]}
    pick = np.sort(np.random.default_rng(seed).choice(len(new.labels), size=sample, replace=False))
    order = np.argsort(order_keys("random", [int(i) for i in pick], [{}] * sample, seed=seed), kind="stable")
    epochs = PRESETS["gpu"]
    files = {
        "old": RUNS / "old.pt",
        "new": RUNS / "new.pt",
        **{n: RUNS / heads_file(loss, rho, epochs["head_epochs"]) for n, (loss, rho) in HEADS.items()},
        **{n: RUNS / adapter_file(kind, epochs["adapter_epochs"]) for n, kind in ADAPTERS.items()},
    }
    print(
        f"\nCIFAR-10 extended-class: forecast on {sample} test images (label-free) vs mAP_t on all 10,000\n"
    )
    header("mAP_t % (cifar_table.py)")
    rows = []
    for name, m in rm_methods(files, old, new).items():  # rm mode: the method's own old-side query
        modes = forecast(m.gallery_old[pick], m.gallery_new[pick], m.query_old[pick], order=order)
        rows.append(compare(name, list(modes[-1].recall), table[name]))
    return rows


def rmq(*args: str, store: Path) -> str:
    done = subprocess.run([*RMQ, "--qdrant", str(store), *args], capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"rmq {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def cost_part(work: Path, sample: int) -> dict[str, object]:
    store = work / "qdrant"
    if not (work / "model.onnx").is_file():
        heads, model, old = RUNS / "heads-mcl-e50.pt", work / "model.onnx", work / "old.onnx"
        rmq("export", "--new", str(RUNS / "new.pt"), "--heads", str(heads), "--out", str(model), store=store)
        rmq("export", "--old", str(RUNS / "old.pt"), "--out-old", str(old), store=store)
    if not (work / "indexed").is_file():
        started = time.perf_counter()
        test, old = str(cifar_root() / "test"), str(work / "old.onnx")
        rmq("index", "--collection", "test", "--data", test, "--encoder", old, store=store)
        print(f"indexed the 10,000 test images in {time.perf_counter() - started:.0f} s")
        rmq(
            "init",
            "--name",
            "cifar",
            "--old-collection",
            "test",
            "--encoder",
            str(work / "model.onnx"),
            store=store,
        )
        (work / "indexed").touch()
    started = time.perf_counter()
    out = json.loads(rmq("probe", "--name", "cifar", "--sample", str(sample), "--json", store=store))
    seconds = time.perf_counter() - started
    print(
        f"\nrmq probe --sample {sample} on CIFAR-10 (small CNN, MCL + ρ graph): {seconds:.1f} s as a process"
    )
    print(f"recommendation: {out['recommendation']}")
    return {"seconds": seconds, "probe": out}


def digits_part(work: Path) -> list[dict[str, object]]:
    demo = work / "demo"
    shutil.rmtree(demo, ignore_errors=True)  # the demo builds its store afresh
    started = time.perf_counter()
    report = json.loads(subprocess.run(
        [*RMQ, "demo", "--out", str(demo), "--json"], capture_output=True, text=True, check=True
    ).stdout)  # fmt: skip
    print(f"\nrmq demo in {time.perf_counter() - started:.0f} s")
    store, test = demo / "probe-qdrant", demo / "digits" / "test"
    rows = []
    header("served mAP@100 % (rmq demo)")
    for mode, encoder, extra in (
        ("naive", "new.onnx", ["--old-encoder", str(demo / "old.onnx")]),
        ("rm", "model.onnx", []),
    ):
        rmq(
            "index",
            "--collection",
            mode,
            "--data",
            str(test),
            "--encoder",
            str(demo / "old.onnx"),
            store=store,
        )
        rmq(
            "init",
            "--name",
            mode,
            "--old-collection",
            mode,
            "--encoder",
            str(demo / encoder),
            *extra,
            store=store,
        )
        out = json.loads(rmq("probe", "--name", mode, "--order", "confidence", "--json", store=store))
        curve = next(f for f in out["forecasts"] if f["mode"] == mode)["recall"]
        rows.append(compare(f"digits {mode}", curve, [r[f"{mode}_map"] for r in report["rows"]]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="cifar,cost,digits")
    parser.add_argument("--sample", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=str(ROOT / ".cache" / "probe"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "probe_forecast.json"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    results: dict[str, object] = {"command": "python benchmarks/probe_forecast.py " + " ".join(sys.argv[1:])}
    if "cifar" in parts:
        results["cifar"] = cifar_part(args.sample, args.seed)
    if "cost" in parts:
        results["cost"] = cost_part(work, args.sample)
    if "digits" in parts:
        results["digits"] = digits_part(work)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
