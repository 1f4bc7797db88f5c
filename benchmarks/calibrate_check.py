"""Does ``rmq calibrate`` keep only maps that serve better than the plain merge?

For each pair ``benchmarks/fit_table.py`` has scored (its store under ``.cache/fit-bench/<tag>``,
a naive pair ``team`` over the training images), this runs ``rmq calibrate --name team
--sample 20000 --json`` as a team would (no ``--force``; where fit_table.py's own ``rmq
calibrate --force`` run already reports a ``refused`` reason, that run's decision is read
instead), and sets its decision beside what the
map does on the test images, which it never saw: fit_table's rows ``RM_naive`` and
``calibrated naive (rmq calibrate)`` (its map was fitted with the same sample, seed and holdout).

Run: ``python benchmarks/calibrate_check.py [--tags TAG ...] [--out FILE]``
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cifar import ROOT  # noqa: E402
from benchmarks.cifar_table import machine  # noqa: E402
from benchmarks.fit_summary import CALIBRATED, RESULTS, kept_without_force, tag_arguments  # noqa: E402


def check(tag: str, reports: dict[str, dict]) -> str:
    data = json.loads((RESULTS / f"fit-{tag}.json").read_text())
    rows = data["rows"]
    naive, mapped = rows["RM_naive"], rows[CALIBRATED]
    earlier = data["fit_reports"].get(CALIBRATED, {})
    if "refused" in earlier:  # fit_table ran this rmq calibrate already (with --force): its decision is there
        report, seconds = earlier, data["seconds"][CALIBRATED]
    else:
        store = ROOT / ".cache" / "fit-bench" / tag / "store"
        command = [sys.executable, "-m", "rm_qdrant", "--qdrant", str(store), "calibrate", "--name", "team"]
        started = time.perf_counter()
        done = subprocess.run(
            [*command, "--sample", "20000", "--json"], capture_output=True, text=True, check=False
        )
        seconds = time.perf_counter() - started
        if done.returncode not in (0, 3):
            sys.exit(f"{tag}: rmq calibrate failed ({done.returncode}): {done.stderr}")
        report = json.loads(done.stdout)
    reports[tag] = report
    plain, calibrated = (f["area"] for f in report["forecasts"])
    guard = report["guard"]
    i = guard["fractions"].index(guard["worst_t"])
    m = mapped["map"]
    return (
        f"| {tag} | {report['held_out']} | {100 * (mapped['auc'] - naive['auc']):+.1f} | "
        f"{100 * (min(m) - m[0]):+.1f} | {calibrated:.3f} vs {plain:.3f} | "
        f"{'pass' if guard['passed'] else 'refuse'} (t = {guard['worst_t']:g}: {guard['fitted'][i]:.3f} vs "
        f"{guard['naive'][i]:.3f}, tolerance {guard['tolerances'][i]:.3f}) | "
        f"{'kept' if kept_without_force(report) else 'not kept'} | {seconds:.0f} |"
    )


def main() -> None:
    args = tag_arguments(__doc__, "calibrate-check.md")
    lines = [
        "# rmq calibrate's decision against what its map serves",
        "",
        f"- Command: `{' '.join(['python benchmarks/calibrate_check.py', *sys.argv[1:]])}`",
        f"- Machine: {machine()}; date {datetime.date.today().isoformat()}",
        "- Served: the map on the test images (fit_table.py's rows): AUC_mAP − RM_naive's, and the lowest "
        "mAP_t − its t = 0 (negative: the curve falls below where it started)",
        "- Forecast: area under recall@10 against the new model's own top 10 on the held-out sample, "
        "calibrated vs plain (what `rmq calibrate` alone decided by before the guard); guard: the "
        "deciding t, support of the calibrated merge's hits vs the plain merge's",
        "",
        "| pair | held out | served: AUC − naive | served: dip | forecast | guard | rmq calibrate | s |",
        "|---|--:|--:|--:|--:|---|---|--:|",
    ]
    reports: dict[str, dict] = {}
    for tag in args.tags:
        if (RESULTS / f"fit-{tag}.json").is_file() and (
            ROOT / ".cache" / "fit-bench" / tag / "store"
        ).is_dir():
            lines.append(check(tag, reports))
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(reports, indent=1))


if __name__ == "__main__":
    main()
