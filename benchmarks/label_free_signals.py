"""Which label-free signal predicts what a fitted graph serves? (issue 39)

For each pair of backbones (old, new) on a gallery:

1. both backbones are trained (``train_backbone``, as ``rmq train backbone``), and the
   gallery (training images) and the test images are embedded with each, L2-normalised as the
   exported graphs give them;
2. ``rmq fit``'s label-free path is replayed on the gallery: the fit's holdout (a tenth), then
   the recipe's own holdout of the rest (a tenth), and every candidate (Procrustes and one ψ per
   cluster ladder, :func:`rm_qdrant_train.label_free.train_candidates`) trained on what is left;
3. every candidate, and the naive merge, is scored on both holdouts by each label-free signal
   (per query, per backfill fraction t) and, for reference, by the gallery's labels (mAP), and is
   served on the test images (each a query against the others, random order, 11 points, mAP).

The per-query arrays are saved, so the rules of :mod:`benchmarks.label_free_rules` are replayed
over every pair without training again.

Run: ``python benchmarks/label_free_signals.py [--pairs NAME ...]`` (each pair cached under
``.cache/signals``); then ``python benchmarks/label_free_rules.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cifar import ROOT  # noqa: E402
from benchmarks.fit_table import curve  # noqa: E402
from benchmarks.glyphs import write_glyphs  # noqa: E402
from rm_qdrant.core.forecast import holdout_split, merged_distances, top_k  # noqa: E402
from rm_qdrant.core.guard import support  # noqa: E402
from rm_qdrant.core.metrics import FRACTIONS, area, migrated_at  # noqa: E402
from rm_qdrant.core.spaces import distance_matrix  # noqa: E402

WORK = ROOT / ".cache" / "signals"
K = 10
HOLDOUT = 0.1


@dataclass(frozen=True)
class Pair:
    data: str  # glyphs-<classes>-<seed> | digits
    setting: str  # open | extended
    old: tuple[str, int, int]  # arch, dim, epochs
    new: tuple[str, int, int]
    seed: int = 0  # the class split's and the training's

    @property
    def few_shot(self) -> bool:
        return self.data.startswith("glyphs") and self.setting == "open"


PAIRS = {
    "glyphs-open-a": Pair("glyphs-400-0", "open", ("small-cnn", 128, 15), ("small-cnn", 128, 15)),
    "glyphs-open-b": Pair("glyphs-300-1", "open", ("small-cnn", 128, 6), ("small-cnn", 128, 8), seed=1),
    "glyphs-open-c": Pair("glyphs-300-2", "open", ("small-cnn", 128, 6), ("small-cnn", 128, 8), seed=2),
    "glyphs-open-weak": Pair("glyphs-300-1", "open", ("small-cnn", 64, 3), ("small-cnn", 64, 5), seed=3),
    "glyphs-open-wide": Pair("glyphs-300-2", "open", ("small-cnn", 128, 6), ("small-cnn", 256, 8), seed=2),
    "glyphs-open-d": Pair("glyphs-300-3", "open", ("small-cnn", 128, 6), ("small-cnn", 128, 10), seed=4),
    "glyphs-extended": Pair("glyphs-300-1", "extended", ("small-cnn", 128, 6), ("small-cnn", 128, 8), seed=1),
    "digits-extended": Pair("digits", "extended", ("small-cnn", 128, 12), ("small-cnn", 128, 12)),
    "digits-extended-resnet": Pair("digits", "extended", ("small-cnn", 128, 12), ("resnet18", 256, 6)),
    "digits-open": Pair("digits", "open", ("small-cnn", 128, 12), ("small-cnn", 128, 12)),
    "digits-open-b": Pair("digits", "open", ("small-cnn", 128, 6), ("small-cnn", 128, 12), seed=1),
    "digits-extended-weak": Pair("digits", "extended", ("small-cnn", 64, 3), ("small-cnn", 128, 12), seed=2),
}


def dataset(name: str) -> Path:
    root = WORK / "data" / name
    if name == "digits":
        from rm_qdrant_train.demo import write_digits

        if not (root / "test").is_dir():
            write_digits(root)
        return root
    _, classes, seed = name.split("-")
    few = int(classes) < 400  # the smaller galleries: 10 drawings a class to train on, 5 to test
    return write_glyphs(
        root, classes=int(classes), train=10 if few else 14, test=5 if few else 6, seed=int(seed)
    )


def backbone(pair: Pair, role: str, data: Path, runs: Path) -> Path:
    from rm_qdrant_train.backbone import train_backbone
    from rm_qdrant_train.config import BackboneConfig

    arch, dim, epochs = getattr(pair, role)
    out = runs / f"{pair.data}-{pair.setting}-{role}-{arch}-{dim}-e{epochs}-s{pair.seed}.pt"
    if not out.is_file():
        train_backbone(
            BackboneConfig(
                data=str(data),
                out=str(out),
                role=role,
                setting=pair.setting,
                arch=arch,
                embed_dim=dim,
                epochs=epochs,
                batch=64,
                lr=0.05,
                flip=not pair.data.startswith("glyphs"),  # a mirrored glyph is often another glyph
                seed=pair.seed,
            )
        )
    return out


def embeddings(path: Path, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """Unit-length embeddings of a folder's images (as the exported graph gives them) and labels."""
    from rm_qdrant_train.backbone import embed, load_backbone
    from rm_qdrant_train.data import load_image_folder

    model, meta = load_backbone(path)
    images = load_image_folder(folder, size=meta["image_size"])
    emb, _ = embed(model, images.images, device=torch.device("cpu"), mean=meta["mean"], std=meta["std"])
    emb = torch.nn.functional.normalize(emb, dim=1).numpy()
    return emb, images.labels


def per_query(old, base, new, rev, order, labels=None, rows=None, k=K) -> dict[str, np.ndarray]:
    """(len(rows), len(FRACTIONS)) per signal: each query's value at every t, for the merge of
    (new, rev). The arrays are the gallery; ``rows`` the queries among it (None: every item)."""
    n = len(old)
    rows = np.arange(n) if rows is None else rows
    at = np.arange(len(rows))

    def nearest(x: np.ndarray, depth: int) -> np.ndarray:
        d = distance_matrix(x[rows], x, "cosine")
        d[at, rows] = np.inf
        return np.argsort(d, 1, kind="stable")[:, :depth]

    ref_new, ref_old = nearest(base, k), nearest(old, k)

    def within(x: np.ndarray, depth: int) -> np.ndarray:
        mask = np.zeros((len(rows), n), bool)
        np.put_along_axis(mask, nearest(x, depth), True, 1)
        return mask

    cons = within(old, 3 * k) & within(
        base, 3 * k
    )  # items in both models' top 3k: the neighbours both agree on
    both = support(old, base, k, rows=rows)
    # The same at the holdout's density: a top k among n_h held-out points is a top k·n/n_h of the sample.
    dense = max(k, round(k * n / len(rows)))
    new_dense, old_dense = within(base, dense), within(old, dense)
    cons_dense = within(old, 3 * dense) & within(base, 3 * dense)
    both_dense = support(old, base, dense, rows=rows)
    d_new = distance_matrix(base[rows], base, "cosine")
    d_new[at, rows] = np.inf
    rank_new = np.argsort(np.argsort(d_new, 1, kind="stable"), 1, kind="stable")  # as rank_guard ranks
    names = ("recall_new", "recall_old", "consensus", "support", "new_dense", "old_dense", "consensus_dense")
    names += ("logrank",)
    names += ("support_dense",) + (() if labels is None else ("precision",))
    out = {name: np.zeros((len(rows), len(FRACTIONS))) for name in names}
    for i, t in enumerate(FRACTIONS):
        migrated = migrated_at(order, t)
        found = top_k(merged_distances(new[rows], rev[rows], new, old, migrated), k, rows)
        out["recall_new"][:, i] = (found[:, :, None] == ref_new[:, None, :]).any(2).mean(1)
        out["recall_old"][:, i] = (found[:, :, None] == ref_old[:, None, :]).any(2).mean(1)
        out["consensus"][:, i] = np.take_along_axis(cons, found, 1).mean(1)
        out["support"][:, i] = np.take_along_axis(both, found, 1).mean(1)
        out["logrank"][:, i] = (1 - np.log1p(np.take_along_axis(rank_new, found, 1)) / np.log(n)).mean(1)
        for name, mask in (
            ("new_dense", new_dense),
            ("old_dense", old_dense),
            ("consensus_dense", cons_dense),
            ("support_dense", both_dense),
        ):
            out[name][:, i] = np.take_along_axis(
                mask.astype(float) if mask.dtype == bool else mask, found, 1
            ).mean(1)
        if labels is not None:
            out["precision"][:, i] = (labels[found] == labels[rows][:, None]).mean(1)
    return out


def cached_candidates(path: Path, phi: torch.Tensor, old: torch.Tensor) -> list:
    """``train_candidates`` on (phi, old), or the candidates a run before saved at ``path``: their
    weights and layer counts only, read with ``weights_only`` (no pickled code runs)."""
    from torch import nn

    from rm_qdrant_train.heads import Heads
    from rm_qdrant_train.label_free import train_candidates

    if path.is_file():
        saved = torch.load(path, weights_only=True)
        trained = []
        for recipe, blocks, state in zip(saved["recipes"], saved["psi_blocks"], saved["states"], strict=True):
            heads = Heads(phi.shape[1], old.shape[1], learn_rho=False, psi_blocks=blocks)
            heads.load_state_dict(state)
            trained.append((recipe, heads.eval()))
        return trained
    trained = train_candidates(phi, old, seed=0)
    path.parent.mkdir(exist_ok=True)
    blocks = [sum(isinstance(m, nn.Linear) for m in heads.psi) for _, heads in trained]
    states = [heads.state_dict() for _, heads in trained]
    torch.save({"recipes": [r for r, _ in trained], "psi_blocks": blocks, "states": states}, path)
    return trained


def run_pair(name: str, pair: Pair) -> Path:
    from rm_qdrant_train.holdout import apply_heads
    from rm_qdrant_train.label_free import HOLDOUT as INNER

    target = WORK / f"{name}.npz"
    if target.is_file():
        with np.load(target) as done:
            if "outer-g|naive|logrank" in done.files:
                return target
    data, runs = dataset(pair.data), WORK / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    paths = {role: backbone(pair, role, data, runs) for role in ("old", "new")}
    g_old, g_labels = embeddings(paths["old"], data / "train")
    g_new, _ = embeddings(paths["new"], data / "train")
    t_old, t_labels = embeddings(paths["old"], data / "test")
    t_new, _ = embeddings(paths["new"], data / "test")
    fit_idx, outer_idx = holdout_split(len(g_old), HOLDOUT, 0, k=K)  # rmq fit's split (seed 0)
    tr, inner = holdout_split(len(fit_idx), INNER, 0)  # the recipe's own
    inner_idx, train_idx = fit_idx[inner], fit_idx[tr]
    phi, old = torch.from_numpy(g_new), torch.from_numpy(g_old)
    from rm_qdrant_train.fit import match_norms

    trained = cached_candidates(WORK / "heads" / f"{name}.pt", phi[train_idx], old[train_idx])
    candidates = [("naive", None)] + [
        (recipe, match_norms(heads, phi[fit_idx], old[fit_idx])) for recipe, heads in trained
    ]
    arrays: dict[str, np.ndarray] = {}
    test_order = np.random.default_rng(0).permutation(len(t_old))
    everything = np.arange(len(g_old))
    # Each holdout's queries judged two ways: against the rest of the holdout (as rmq fit did
    # until issue 39), and against the whole sample the recipe saw (its gallery).
    views = {
        "inner": (inner_idx, None),
        "outer": (outer_idx, None),
        "inner-g": (fit_idx, np.searchsorted(fit_idx, inner_idx)),
        "outer-g": (everything, outer_idx),
    }
    for held, (gallery, rows) in views.items():
        order = np.random.default_rng(0).permutation(len(gallery))  # as holdout_forecast orders it
        for recipe, heads in candidates:
            new, rev = (
                (g_new[gallery], g_old[gallery]) if heads is None else apply_heads(heads, g_new[gallery])
            )
            values = per_query(g_old[gallery], g_new[gallery], new, rev, order, g_labels[gallery], rows)
            for signal, value in values.items():
                arrays[f"{held}|{recipe}|{signal}"] = value
    for recipe, heads in candidates:
        new, rev = (t_new, t_old) if heads is None else apply_heads(heads, t_new)
        arrays[f"served|{recipe}"] = np.array(curve(new, rev, new, t_old, t_labels, test_order)["map"])
    for role, x in (("Old", t_old), ("New", t_new)):
        arrays[f"served|{role}"] = np.array(curve(x, x, x, x, t_labels, test_order)["map"])
    meta = {
        "pair": name,
        **{k: v for k, v in pair.__dict__.items()},
        "gallery": len(g_old),
        "classes": int(len(np.unique(g_labels))),
        "test": len(t_old),
        "inner": len(inner_idx),
        "outer": len(outer_idx),
        "candidates": [recipe for recipe, _ in candidates],
        "seconds": round(time.perf_counter() - started),
    }
    np.savez(target, meta=json.dumps(meta), **arrays)
    old_auc, naive_auc = area(arrays["served|Old"]), area(arrays["served|naive"])
    print(f"{name}: {meta['seconds']} s; Old AUC {old_auc:.3f}, naive {naive_auc:.3f}", flush=True)
    for recipe, _ in candidates[1:]:
        m = arrays[f"served|{recipe}"]
        print(f"  {recipe}: t0 {m[0]:.3f} (Old {arrays['served|Old'][0]:.3f}), AUC {area(m):.3f}", flush=True)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", nargs="*", default=list(PAIRS), choices=list(PAIRS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    WORK.mkdir(parents=True, exist_ok=True)
    for name in args.pairs:
        run_pair(name, PAIRS[name])


if __name__ == "__main__":
    main()
