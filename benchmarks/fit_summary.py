"""Issue 28's table over the pairs ``benchmarks/fit_table.py`` has scored: what ``rmq fit`` serves.

Reads ``benchmarks/results/fit-<tag>.json`` (one per pair, written by fit_table.py; every
``rmq fit`` there ran with ``--force`` so that each graph is scored) and prints, per pair and row:
Gain, t = 0 − Old, final − New, the lowest mAP_t − its t = 0 (a dip), AUC − RM_naive, which
label-free candidate won and the guard's decision. ``served`` is what ``rmq fit`` without
``--force`` leaves in place: the fitted graph where its guard (or, with labels, its holdout
check) passed, else the naive merge it keeps.

Goals (issue 28): on every pair the label-free row's AUC ≥ RM_naive's and its t = 0 ≥ Old − 0.5
mAP, or the naive merge is kept.

Run: ``python benchmarks/fit_summary.py [--tags TAG ...] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
TAGS = [
    "digits-small-cnn-128-e12-12",
    "digits-open-small-cnn-128-e12-12",
    "digits-resnet18-256-e12-6",
    "cifar-small-cnn-128-e8-5",
    "cifar-open-small-cnn-128-e8-5",
    "cifar-resnet18-256-e8-6",
]
LABEL_FREE = "rmq fit, no labels"
CALIBRATED = "calibrated naive (rmq calibrate)"


def kept_without_force(report: dict[str, Any]) -> bool | None:
    """Whether ``rmq fit`` / ``rmq calibrate`` would have kept its result without ``--force``."""
    if "refused" in report:  # rmq calibrate says why it keeps no map
        return report["refused"] is None
    return report.get("better_than_naive", report.get("better_than_plain"))  # older calibrate reports


def decision(report: dict[str, Any]) -> tuple[bool | None, str]:
    """(did the command keep its result, the deciding evidence in a few words)."""
    if not report:
        return None, ""
    kept = kept_without_force(report)
    guard = report.get("guard")
    if guard is None:
        return kept, f"holdout: {'better' if kept else 'not better'}"
    verdict = "accept" if guard["passed"] else "refuse"
    return kept, f"guard: {verdict} (t = {guard['worst_t']:g}: {min_margin(guard)})"


def min_margin(guard: dict[str, Any]) -> str:
    i = guard["fractions"].index(guard["worst_t"])
    return f"{guard['fitted'][i]:.3f} vs naive {guard['naive'][i]:.3f}"


def rows_of(tag: str, calibrations: dict[str, Any]) -> list[str]:
    data = json.loads((RESULTS / f"fit-{tag}.json").read_text())
    rows, reports = data["rows"], data["fit_reports"]
    if tag in calibrations:  # rmq calibrate's decision as it is now (calibrate_check.py), same sample
        reports = {**reports, CALIBRATED: calibrations[tag]}
    old, new, naive = rows["Old"], rows["New"], rows["RM_naive"]
    out = []
    for name, row in rows.items():
        if name in ("Old", "New"):
            continue
        m = row["map"]
        report = reports.get(name, {})
        kept, why = decision(report)
        served = row if kept in (True, None) else naive
        winner = report.get("winner", "") if name == LABEL_FREE else ""
        out.append(
            f"| {tag} | {name} | {100 * row['gain']:.0f} % | {100 * (m[0] - old['map'][0]):+.1f} | "
            f"{100 * (m[-1] - new['map'][-1]):+.1f} | {100 * (min(m) - m[0]):+.1f} | "
            f"{100 * (row['auc'] - naive['auc']):+.1f} | {winner} | {why} | "
            f"{'' if kept is None else 'graph' if kept else 'naive merge'} "
            f"({100 * (served['auc'] - naive['auc']):+.1f}) |"
        )
    return out


def tag_arguments(doc: str, out: str) -> argparse.Namespace:
    """``--tags`` (the pairs, default every one) and ``--out`` (default ``results/OUT``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tags", nargs="+", default=TAGS)
    parser.add_argument("--out", type=Path, default=RESULTS / out)
    return parser.parse_args()


def main() -> None:
    args = tag_arguments(__doc__, "fit-summary.md")
    found = [t for t in args.tags if (RESULTS / f"fit-{t}.json").is_file()]
    lines = [
        "# rmq fit on every pair: what each row serves (issue 28)",
        "",
        "- Command: `python benchmarks/fit_summary.py` over the JSON that `benchmarks/fit_table.py` wrote "
        "(each pair's command, machine and date are in its own fit-<tag>.md)",
        "- Columns in mAP points on the test images: t = 0 − Old, final (t = 1) − New, lowest mAP_t − its "
        "t = 0 (0: never falls), AUC_mAP − RM_naive's. Gain = (AUC − AUC_Old) / (AUC_New − AUC_Old).",
        "- served: what `rmq fit` or `rmq calibrate` without `--force` leaves: the graph or map where its "
        "checks passed (the label-free guard and the forecast; with labels, the holdout's mAP), else the "
        "naive merge; in brackets that choice's AUC − RM_naive's. The calibrate rows' decision is "
        "`benchmarks/calibrate_check.py`'s (rmq calibrate as it is now, on the same store and sample) "
        "where it has run",
        "",
        "| pair | row | Gain | t=0 − Old | final − New | dip | AUC − naive | label-free winner "
        "| decided by | served |",
        "|---|---|--:|--:|--:|--:|--:|---|---|---|",
    ]
    checked = RESULTS / "calibrate-check.json"
    calibrations = json.loads(checked.read_text()) if checked.is_file() else {}
    for tag in found:
        lines += rows_of(tag, calibrations)
    missing = sorted(set(args.tags) - set(found))
    if missing:
        lines += ["", f"Not scored yet: {', '.join(missing)}"]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
