"""Peak memory and time of the holdout's forecast and guard, scored whole or in query chunks.

``rmq calibrate``, ``rmq fit`` and ``rmq probe`` compare every held-out point with every
other one. Scored as whole (n, n) matrices, a 20,000-point holdout (``--sample 200000`` at the
default ``--holdout 0.1``) needed 15-20 GB; in chunks of ``ROW_CELLS`` cells it needs the
chunk's. Each size and way runs in a fresh process (its peak RSS is its own): the calibrate
path (the calibrated forecast, then the guard) on two synthetic unnormalised models.

Run: ``python benchmarks/forecast_memory.py [--sizes 2000 6000] [--whole-up-to 6000]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one(n: int, whole: bool) -> dict[str, float]:
    from rm_qdrant.core import forecast as fc
    from rm_qdrant.core.calibration import fit_calibration
    from rm_qdrant.core.guard import guard

    if whole:
        fc.ROW_CELLS = n * n  # one chunk: the whole matrices, as before the chunking
    rng = np.random.default_rng(0)
    old = (rng.normal(size=(n, 64)) * rng.uniform(0.5, 3, size=(n, 1))).astype(np.float32)
    new = (old @ rng.normal(size=(64, 128)) + rng.normal(size=(n, 128))).astype(np.float32)
    order = rng.permutation(n)
    calibration = fit_calibration(old[:1000], new[:1000], metric="cosine", method="isotonic", seed=0)
    start = time.perf_counter()
    fc.compare_calibrated(old, new, calibration, order=order)
    guard(old, new, new, old, order=order, fitted_distance=calibration)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 6000])
    parser.add_argument("--whole-up-to", type=int, default=6000, help="Largest n also scored whole.")
    parser.add_argument("--one", nargs=2, metavar=("N", "WAY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1] == "whole")))
        return
    print(
        f"load {os.getloadavg()[0]:.1f}; the calibrate path: compare_calibrated + guard, 11 fractions, k 10"
    )
    print("| held out | way | seconds | peak RSS GB |\n|--:|---|--:|--:|")
    for n in args.sizes:
        for way in ("whole", "chunked") if n <= args.whole_up_to else ("chunked",):
            out = subprocess.run(
                [sys.executable, __file__, "--one", str(n), way], capture_output=True, text=True, check=True
            )
            r = json.loads(out.stdout)
            print(f"| {n:,} | {way} | {r['seconds']:.1f} | {r['peak_rss_gb']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
