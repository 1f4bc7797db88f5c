"""Side by side: rmq calibrate's two maps (isotonic, quantile) on the same pair and the same sample.

Reuses benchmarks/fit_table.py's pipeline (backbones, export+stamp, index + init, test scoring,
its caches); only the calibrate row is measured, once per map, on the same sampled rows, the
same held-out rows and the same test order. Results go to benchmarks/results/calibration-maps-*.

    python benchmarks/calibration_maps.py --data digits --epochs 12
    python benchmarks/calibration_maps.py --data digits --epochs 12 \
        --new-epochs 6 --new-arch resnet18 --new-dim 256
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

import numpy as np

HEAD = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HEAD))

from benchmarks import fit_table as ft  # noqa: E402
from benchmarks.cifar import ROOT  # noqa: E402
from benchmarks.cifar_table import machine  # noqa: E402
from rm_qdrant import load_pair, open_store, scan_image_folder  # noqa: E402
from rm_qdrant.api.common import draw_with_steps  # noqa: E402
from rm_qdrant.core import calibration as quant  # noqa: E402
from rm_qdrant.core.forecast import compare_calibrated, holdout_split  # noqa: E402
from rm_qdrant.core.metrics import area, gain  # noqa: E402
from rm_qdrant.serving.dual import DualIndex  # noqa: E402
from rm_qdrant.sources import SourceConfig  # noqa: E402

assert Path(quant.__file__).resolve().is_relative_to(HEAD), quant.__file__

OUT = HEAD / "benchmarks" / "results"


def cli_calibrate(store: Path, sample: int, force: bool) -> tuple[int, dict, float]:
    cmd = [*ft.RMQ, "--qdrant", str(store), "calibrate", "--name", "team", "--sample", str(sample), "--json"]
    cmd += ["--force"] if force else []
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    secs = time.perf_counter() - t0
    if done.returncode not in (0, 3):
        sys.exit(f"failed: {cmd}\n{done.stdout}\n{done.stderr}")
    print(f"  rmq calibrate{' --force' if force else ''}: rc {done.returncode}, {secs:.0f} s", flush=True)
    return done.returncode, json.loads(done.stdout), secs


def keep_rule(old_h, new_h, cal, metric: str, k: int = 10, seed: int = 0) -> dict:
    order = np.random.default_rng(seed).permutation(len(old_h))
    plain, calibrated = compare_calibrated(old_h, new_h, cal, order=order, k=k, metric=metric)
    return {
        "plain_area": plain.area,
        "calibrated_area": calibrated.area,
        "kept": bool(calibrated.area > plain.area),
        "calibrated_old_share": list(calibrated.old_share or ()),
        "plain_old_share": list(plain.old_share or ()),
        "old_gallery": list(calibrated.old_gallery or ()),
        "calibrated_recall": list(calibrated.recall),
        "plain_recall": list(plain.recall),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", choices=["cifar", "digits"], default="cifar")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--new-epochs", type=int)
    parser.add_argument("--new-arch", default="small-cnn")
    parser.add_argument("--new-dim", type=int, default=128)
    parser.add_argument("--sample", type=int, default=20000)
    args = parser.parse_args()
    args.new_epochs = args.new_epochs or args.epochs
    tag = f"{args.data}-{args.new_arch}-{args.new_dim}-e{args.epochs}-{args.new_epochs}"
    work = ROOT / ".cache" / "fit-bench" / tag
    work.mkdir(parents=True, exist_ok=True)
    wall: dict[str, float] = {}
    t0 = time.perf_counter()
    data = ft.dataset(args.data, work.parent)
    runs, onnx, store = work / "runs", work / "onnx", work / "store"
    os.environ.setdefault("RMQ_CACHE_DIR", str(work / "cache"))
    print(f"{tag}: backbones", flush=True)
    t = time.perf_counter()
    trained = ft.backbones(args, data, runs)
    ft.export_and_stamp(runs, onnx)
    wall["data+backbones+export"] = time.perf_counter() - t
    t = time.perf_counter()
    shutil.rmtree(store, ignore_errors=True)
    t_index = ft.gallery_pair(
        store,
        "team",
        data / "train",
        onnx / "old.onnx",
        "--encoder",
        onnx / "new.onnx",
        "--old-encoder",
        onnx / "old.onnx",
    )
    wall["index+init"] = time.perf_counter() - t

    # 1. The CLI as shipped: keep rule without --force, then --force to store the map as fit_table does.
    rc, cli_json, cli_secs = cli_calibrate(store, args.sample, force=False)
    _, cli_forced, cli_forced_secs = cli_calibrate(store, args.sample, force=True)
    wall["rmq calibrate (x2)"] = cli_secs + cli_forced_secs
    with open_store(store) as opened:
        stored = load_pair(opened, "team").old_distance
        pair = load_pair(opened, "team")
        # 2. The same sample, in process: both maps fitted on the same fit rows, compared on the
        # same held-out rows.
        t = time.perf_counter()
        index = DualIndex.open(opened, "team")
        sample = draw_with_steps(
            opened, pair, index.encoder, args.sample, seed=0, source=SourceConfig(), on_step=None
        )
        wall["in-process sample"] = time.perf_counter() - t
    fit_idx, held_idx = holdout_split(len(sample.ids), 0.1, 0, k=10)
    o_fit, n_fit = sample.old[fit_idx], sample.new[fit_idx]
    t = time.perf_counter()
    q_map = quant.fit_calibration(o_fit, n_fit, metric=pair.distance, method="quantile", seed=0)
    wall["fit quantile"] = time.perf_counter() - t
    t = time.perf_counter()
    i_map = quant.fit_calibration(o_fit, n_fit, metric=pair.distance, method="isotonic", seed=0)
    wall["fit isotonic"] = time.perf_counter() - t
    default = i_map if quant.default_map(pair.distance) == "isotonic" else q_map
    same_as_cli = (
        stored is not None and np.allclose(stored.old, default.old) and np.allclose(stored.new, default.new)
    )
    print(f"  distance {pair.distance}; in-process default map == rmq calibrate's stored map: {same_as_cli}")
    maps = {"isotonic": i_map, "quantile": q_map}
    o_held, n_held = sample.old[held_idx], sample.new[held_idx]
    keeps = {name: keep_rule(o_held, n_held, m, pair.distance) for name, m in maps.items()}
    for name, kr in keeps.items():
        print(
            f"  keep rule [{name}]: calibrated {kr['calibrated_area']:.4f} "
            f"vs plain {kr['plain_area']:.4f} -> "
            f"{'kept' if kr['kept'] else 'NOT kept'}",
            flush=True,
        )

    print("scoring on the test images", flush=True)
    t = time.perf_counter()
    items = scan_image_folder(data / "test")
    images = [item.uri for item in items]
    labels = np.unique([item.label for item in items], return_inverse=True)[1]
    order = np.random.default_rng(0).permutation(len(items))
    old = ft.embed(onnx / "old.onnx", images, "embedding")
    new = ft.embed(onnx / "new.onnx", images, "embedding")
    rows = {
        "Old": ft.curve(old, old, old, old, labels, order),
        "New": ft.curve(new, new, new, new, labels, order),
        "RM_naive": ft.curve(new, old, new, old, labels, order),
    }
    for name, m in maps.items():
        rows[name] = ft.curve(new, old, new, old, labels, order, m)
    a_old, a_new = rows["Old"]["auc"], rows["New"]["auc"]
    for row in rows.values():
        row["gain"] = gain(row["auc"], a_old, a_new)
        row["never_falls"] = all(m >= row["map"][0] - 1e-9 for m in row["map"])
    # Old side's share of the merged top 10 on the test gallery (no labels), per map.
    test_share = {
        name: keep_rule(old, new, m, pair.distance)["calibrated_old_share"] for name, m in maps.items()
    }
    test_share["plain (RM_naive)"] = keep_rule(old, new, stored, pair.distance)["plain_old_share"]
    wall["scoring"] = time.perf_counter() - t
    wall["total"] = time.perf_counter() - t0

    command = "python benchmarks/calibration_maps.py " + " ".join(sys.argv[1:])
    lines = [
        f"# calibrate row, isotonic vs quantile map: {tag}",
        "",
        f"- Command: `{command}`",
        f"- Machine: {machine()}; date {datetime.date.today().isoformat()}",
        f"- Pair distance: {pair.distance}; sample {len(sample.ids)} "
        f"({len(fit_idx)} fit, {len(held_idx)} held out); "
        f"in-process {quant.default_map(pair.distance)} map identical to `rmq calibrate`'s stored one: "
        f"{same_as_cli}",
        f"- Backbones trained here: {', '.join(f'{k} {v:.0f} s' for k, v in trained.items()) or 'cached'}; "
        f"index {t_index:.0f} s",
        f"- Wall times (s): {', '.join(f'{k} {v:.0f}' for k, v in wall.items())}",
        f"- `rmq calibrate` (no --force): rc {rc}, kept {cli_json['kept']}; held-out recall@10 area "
        + ", ".join(f"{f['mode']} {area(f['recall']):.3f}" for f in cli_json["forecasts"]),
        "",
        "| row | AUC_mAP | Gain | mAP t=0 | t=0.5 | t=1 | never falls "
        "| keep rule (held-out recall@10 area, cal vs plain) |",
        "|---|--:|--:|--:|--:|--:|:-:|:-:|",
    ]
    for name, row in rows.items():
        m = row["map"]
        kr = keeps.get(name)
        kt = (
            ""
            if kr is None
            else (
                f"{'kept' if kr['kept'] else 'not kept'} "
                f"({kr['calibrated_area']:.3f} vs {kr['plain_area']:.3f})"
            )
        )
        lines.append(
            f"| {name} | {100 * row['auc']:.1f} | {100 * row['gain']:.0f} % | {100 * m[0]:.1f} | "
            f"{100 * m[5]:.1f} | {100 * m[-1]:.1f} | {'yes' if row['never_falls'] else 'no'} | {kt} |"
        )
    lines += ["", "mAP_t (%) at t = 0, 0.1, …, 1:", ""]
    lines += [f"- {name}: " + " ".join(f"{100 * v:.1f}" for v in row["map"]) for name, row in rows.items()]
    lines += ["", "Old side's share of the merged top 10 on the test gallery (no labels), t = 0 … 1:", ""]
    lines += [f"- {name}: " + " ".join(f"{v:.2f}" for v in s) for name, s in test_share.items()]
    lines += ["", "Knots (old → new):", ""]
    for name, m in maps.items():
        lines.append(
            f"- {name}: {len(m.old)} knots; "
            + ", ".join(
                f"{a:.4g}→{b:.4g}"
                for a, b in list(zip(m.old, m.new, strict=True))[:: max(1, len(m.old) // 12)]
            )
        )
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"calibration-maps-{tag}.md").write_text(text)
    (OUT / f"calibration-maps-{tag}.json").write_text(
        json.dumps(
            {
                "command": command,
                "rows": rows,
                "keep_rule": keeps,
                "cli_no_force": {"rc": rc, **cli_json},
                "cli_force": cli_forced,
                "wall_s": wall,
                "trained": trained,
                "same_as_cli": bool(same_as_cli),
                "test_old_share": test_share,
                "maps": {n: {"old": list(m.old), "new": list(m.new)} for n, m in maps.items()},
            },
            indent=1,
            default=float,
        )
    )


if __name__ == "__main__":
    main()
