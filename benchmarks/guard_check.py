"""Would ``rmq fit``'s label-free guard accept the good fitted graphs and refuse the bad ones?

For each cached digits pair of ``benchmarks/fit_table.py`` (its ONNX backbones under
``.cache/fit-bench/<tag>/onnx``): the training images are the team's gallery (old vectors
from old.onnx, φ_new from new.onnx), split as ``rmq fit`` splits them (--holdout 0.1,
--seed 0); heads are fitted on the training part as ``rmq fit`` fits them, and the guard
decides on the held-out part, no label read. Then each graph is scored with labels on the
test images (mAP at t = 0 against Old, AUC against RM_naive), which the guard never saw.

Run: ``OMP_NUM_THREADS=1 python benchmarks/guard_check.py [--tags digits-small-cnn-128-e12-12 ...]``
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fit_table import curve, embed  # noqa: E402
from rm_qdrant import scan_image_folder  # noqa: E402
from rm_qdrant.core.forecast import holdout_split  # noqa: E402
from rm_qdrant.core.guard import guard  # noqa: E402
from rm_qdrant_train.fit import FitSettings, fit_recipe  # noqa: E402
from rm_qdrant_train.holdout import apply_heads, better, holdout_forecast, holdout_guard  # noqa: E402

ROOT = Path(__file__).resolve().parents[1] / ".cache" / "fit-bench"
RECIPES = {
    "Procrustes": FitSettings(loss="procrustes"),
    "label-free": FitSettings(loss="label-free"),
    "rqt, 1 step (a random ψ)": FitSettings(loss="rqt", steps=1, lr=1e-9),
    "rqt, 2000 steps": FitSettings(loss="rqt"),
}


def images_of(folder: Path) -> tuple[list[str], np.ndarray]:
    items = scan_image_folder(folder)
    return [i.uri for i in items], np.unique([i.label for i in items], return_inverse=True)[1]


def check(tag: str) -> list[str]:
    onnx = ROOT / tag / "onnx"
    train, _ = images_of(ROOT / "digits" / "train")
    test, labels = images_of(ROOT / "digits" / "test")
    old_tr, new_tr = (
        embed(onnx / "old.onnx", train, "embedding"),
        embed(onnx / "new.onnx", train, "embedding"),
    )
    old_te, new_te = embed(onnx / "old.onnx", test, "embedding"), embed(onnx / "new.onnx", test, "embedding")
    fit_idx, held_idx = holdout_split(len(train), 0.1, 0, k=10)
    order = np.random.default_rng(0).permutation(len(test))
    a_old = curve(old_te, old_te, old_te, old_te, labels, order)
    naive = curve(new_te, old_te, new_te, old_te, labels, order)
    lines = [
        f"## {tag}",
        "",
        f"Old mAP {100 * a_old['map'][0]:.1f}; RM_naive AUC_mAP {100 * naive['auc']:.1f} "
        f"(test images, {len(test)}); gallery {len(train)} training images, {len(held_idx)} held out",
        "",
        "| ψ | guard | guard's deciding t: fitted vs naive | guard t=0: fitted vs old | old evidence "
        "(area vs naive) | test mAP t=0 − Old | test AUC − RM_naive | guard on the test images | fit s |",
        "|---|:-:|--:|--:|--:|--:|--:|:-:|--:|",
    ]
    for name, settings in RECIPES.items():
        started = time.perf_counter()
        fitted = fit_recipe(new_tr[fit_idx], old_tr[fit_idx], None, settings)
        seconds = time.perf_counter() - started
        held = (new_tr[held_idx], old_tr[held_idx])
        verdict = holdout_guard(fitted.heads, *held)
        ok_old, measure = better(holdout_forecast(fitted.heads, *held, None))
        new_out, rev_out = apply_heads(fitted.heads, new_te)
        served = curve(new_out, rev_out, new_out, old_te, labels, order)
        late = guard(old_te, new_te, new_out, rev_out, order=order)
        on_test = f"{'accept' if late.passed else 'refuse'} (t={late.fractions[late.worst]:g})"
        w = verdict.worst
        lines.append(
            f"| {name} ({fitted.recipe}) | {'accept' if verdict.passed else 'refuse'} | "
            f"t={verdict.fractions[w]:g}: {verdict.fitted[w]:.3f} vs {verdict.naive[w]:.3f} | "
            f"{verdict.fitted[0]:.3f} vs {verdict.naive[0]:.3f} | "
            f"{'accept' if ok_old else 'refuse'}: {measure.removeprefix('area under recall ')} | "
            f"{100 * (served['map'][0] - a_old['map'][0]):+.1f} | "
            f"{100 * (served['auc'] - naive['auc']):+.1f} | {on_test} | {seconds:.0f} |"
        )
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tags", nargs="+", default=["digits-small-cnn-128-e12-12", "digits-resnet18-256-e12-6"]
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "guard-digits.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [
        "# The label-free guard of rmq fit on the cached digits pairs",
        "",
        f"- Command: `OMP_NUM_THREADS=1 python benchmarks/guard_check.py {' '.join(sys.argv[1:])}`".rstrip(),
        f"- Date {datetime.date.today().isoformat()}; guard (rm_qdrant.core.guard): support of the top 10, "
        "fitted ≥ naive − max(0.002, 2 standard errors) at every t; 'old evidence': today's area under "
        "recall@10 against the new model's own top 10",
        "- The guard column is its decision on the held-out training images, as rmq fit decides; the "
        "last guard column runs it on the test images instead (larger: ~52 images a class against ~13)",
        "",
    ]
    for tag in args.tags:
        lines += [*check(tag), ""]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
