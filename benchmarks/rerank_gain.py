"""Served Gain with the re-rank at K = 10, 50, 100, for the naive and the label-free pairs of the fit table.

The six pairs of ``benchmarks/fit_table.py`` (CIFAR-10 and digits; small-cnn → small-cnn,
small-cnn → resnet18, and the open-class small-cnn pair), from the graphs that command left
under ``.cache/fit-bench/TAG/onnx``: ``old.onnx`` and ``new.onnx`` (the backbones) and
``fit-1.onnx`` (``rmq fit``, no labels). Nothing is trained here: a pair whose graphs are missing
is reported as missing (``python benchmarks/fit_table.py ...`` makes them, half an hour and more
on 2 cores).

Scored as the fit table scores its rows: the test images, each a query against the other test
images as the gallery, backfilled in the same seeded random order, 11 points, mAP over the whole
ranking; Gain = (AUC − AUC_Old) / (AUC_New − AUC_Old). The re-rank works from the embeddings:
an old hit's new-model vector is the new graph's embedding of its image, what the served re-rank
(:class:`rm_qdrant.serving.rerank.Reranker`) computes from the image, every one read in time.
Each query's merged ranking gets its first K re-ordered by :func:`rm_qdrant.core.rerank_rows.
reranked_rows`, the matrix form of :func:`rm_qdrant.core.rerank.reranked` (the two are checked
equal in ``tests/core/test_rerank_rows.py``); with K the gallery's first K, as served.

Run: ``python benchmarks/rerank_gain.py [--tag TAG ...]``; writes ``benchmarks/results/rerank_gain.md``.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cifar import ROOT  # noqa: E402
from benchmarks.cifar_table import machine  # noqa: E402
from rm_qdrant.core.metrics import FRACTIONS, _scores, area, gain, migrated_at, unit  # noqa: E402
from rm_qdrant.core.rerank_rows import reranked_rows  # noqa: E402

TAGS = (
    "cifar-small-cnn-128-e8-5",
    "cifar-resnet18-256-e8-6",
    "cifar-open-small-cnn-128-e8-5",
    "digits-small-cnn-128-e12-12",
    "digits-resnet18-256-e12-6",
    "digits-open-small-cnn-128-e12-12",
)
KS = (10, 50, 100)
CHUNK = 500
OUT = ROOT / "benchmarks" / "results" / "rerank_gain.md"
AT: int | None = None  # --at: mAP@AT instead of the whole ranking


def served_map(
    q_new, q_old, g_new, g_old, labels, migrated, rerank: int | None, at: int | None = None
) -> float:
    """mAP of the merged (and, with ``rerank``, re-ranked) rankings of every query at one state:
    migrated items at the new distance, the rest at the old side's; all vectors of unit length."""
    n = len(labels)
    aps = []
    for start in range(0, n, CHUNK):
        rows = np.arange(start, min(start + CHUNK, n))
        by_new = 1.0 - q_new[rows] @ g_new.T
        dist = by_new.copy()
        dist[:, ~migrated] = 1.0 - q_old[rows] @ g_old[~migrated].T
        if rerank is not None:
            dist = reranked_rows(dist, by_new, rerank, rows)
        aps.append(_scores(dist, labels, rows, at)[0])
    return float(np.concatenate(aps).mean())


def curve(q_new, q_old, g_new, g_old, labels, order, rerank: int | None = None) -> list[float]:
    return [
        served_map(q_new, q_old, g_new, g_old, labels, migrated_at(order, t), rerank, AT) for t in FRACTIONS
    ]


def embeddings(onnx: Path, images: list[str]) -> dict[str, np.ndarray]:
    from benchmarks.fit_table import embed, embed_outputs

    fitted = embed_outputs(onnx / "fit-1.onnx", images, ["new", "rev"])
    return {
        "old": unit(embed(onnx / "old.onnx", images, "embedding")),
        "new": unit(embed(onnx / "new.onnx", images, "embedding")),
        "fit_new": unit(fitted["new"]),
        "fit_rev": unit(fitted["rev"]),
    }


def pair_rows(tag: str) -> dict[str, list[float]] | None:
    """Each row's mAP_t for one pair, or None when its graphs are not cached."""
    onnx = ROOT / ".cache" / "fit-bench" / tag / "onnx"
    if not all((onnx / f).is_file() for f in ("old.onnx", "new.onnx", "fit-1.onnx")):
        return None
    from benchmarks.fit_table import dataset
    from rm_qdrant import scan_image_folder

    data = dataset(tag.split("-")[0], ROOT / ".cache" / "fit-bench")
    items = scan_image_folder(data / "test")
    labels = np.unique([item.label for item in items], return_inverse=True)[1]
    order = np.random.default_rng(0).permutation(len(items))  # the fit table's order
    v = embeddings(onnx, [item.uri for item in items])
    rows = {
        "Old": curve(v["old"], v["old"], v["old"], v["old"], labels, order),
        "New": curve(v["new"], v["new"], v["new"], v["new"], labels, order),
        "naive": curve(v["new"], v["old"], v["new"], v["old"], labels, order),
        "label-free": curve(v["fit_new"], v["fit_rev"], v["fit_new"], v["old"], labels, order),
    }
    for k in KS:
        rows[f"naive + K={k}"] = curve(v["new"], v["old"], v["new"], v["old"], labels, order, k)
        rows[f"label-free + K={k}"] = curve(
            v["fit_new"], v["fit_rev"], v["fit_new"], v["old"], labels, order, k
        )
    return rows


def table(tag: str, rows: dict[str, list[float]]) -> list[str]:
    a_old, a_new, naive = area(rows["Old"]), area(rows["New"]), rows["naive"]
    lines = [
        f"### {tag}",
        "",
        "| row | AUC_mAP | Gain | mAP t=0 | t=0.5 | t=1 | ≥ RM_naive at every t |",
        "|---|--:|--:|--:|--:|--:|:-:|",
    ]
    order = ["naive", *(f"naive + K={k}" for k in KS), "label-free", *(f"label-free + K={k}" for k in KS)]
    for name in order:
        m = rows[name]
        above = all(a >= b - 1e-9 for a, b in zip(m, naive, strict=True))
        g = gain(area(m), a_old, a_new)
        lines.append(
            f"| {name} | {100 * area(m):.1f} | {100 * g:.0f} % | {100 * m[0]:.1f} | "
            f"{100 * m[5]:.1f} | {100 * m[-1]:.1f} | {'yes' if above else 'no'} |"
        )
    lines += ["", f"Old {100 * a_old:.1f}, New {100 * a_new:.1f} (AUC_mAP, %)", ""]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tag", action="append", choices=TAGS, help="a pair of the fit table [default: all six]"
    )
    parser.add_argument(
        "--at", type=int, help="score mAP@AT (as rmq eval and the demo serve) instead of the whole ranking"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="the results file")
    args = parser.parse_args(argv)
    global AT
    AT = args.at
    command = "python benchmarks/rerank_gain.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        "# Served Gain with the re-rank (K = 10, 50, 100), naive and label-free pairs",
        "",
        f"- Command: `{command.strip()}`",
        f"- Machine: {machine()}; date {datetime.date.today().isoformat()}",
        "- Scored as `benchmarks/fit_table.py` scores its rows (test images, each a query against the "
        "others, the seeded random order, 11 points, "
        + ("mAP over the whole ranking" if AT is None else f"mAP@{AT}")
        + "). The re-rank works from "
        "the embeddings: an old hit's new-model vector is the new graph's embedding of its image, every "
        "one taken as read in time; `rm_qdrant.core.rerank_rows.reranked_rows` orders each query's first "
        "K as `rm_qdrant.core.rerank.reranked` orders a served list (checked equal in "
        "tests/core/test_rerank_rows.py).",
        "",
    ]
    missing = []
    for tag in args.tag or TAGS:
        print(f"{tag}...", flush=True)
        rows = pair_rows(tag)
        if rows is None:
            missing.append(tag)
            continue
        lines += table(tag, rows)
    if missing:
        lines += [
            "Not measured (their graphs are not under .cache/fit-bench/TAG/onnx on this machine; this "
            "script trains nothing: `python benchmarks/fit_table.py` makes them): " + ", ".join(missing),
            "",
        ]
    text = "\n".join(lines)
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
