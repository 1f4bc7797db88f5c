"""Replay label-free keep rules over the pairs of ``benchmarks/label_free_signals.py`` (issue 39).

For each signal: how well it ranks the candidates (and the naive merge) of a pair by what they
serve (Spearman rank correlation within the pair, averaged), and, for each rule, which graph
``rmq fit`` would keep on each pair and what that graph serves against the old model at t = 0
and against the naive merge (AUC). Writes ``benchmarks/results/label-free-signals.md``.

Run: ``python benchmarks/label_free_rules.py`` (after ``label_free_signals.py``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.label_free_signals import WORK  # noqa: E402
from rm_qdrant.core.guard import GUARD_MIN_TOLERANCE, GUARD_STANDARD_ERRORS  # noqa: E402
from rm_qdrant.core.metrics import area, gain  # noqa: E402

#: Each holdout judged as its queries against the rest of the holdout, and against the whole sample (-g).
VIEWS = ("inner", "outer", "inner-g", "outer-g")
SIGNALS = (
    "recall_new",
    "recall_old",
    "both",
    "consensus",
    "support",
    "new_dense",
    "old_dense",
    "consensus_dense",
    "support_dense",
    "logrank",
    "precision",
)
Rule = Callable[[dict], str]  # a pair's arrays → the recipe kept ("naive": none)
#: The goal's bounds: a kept graph's served t = 0 at most this far below Old; its AUC not below RM_naive's.
T0_SLACK = 0.005


def load(path: Path) -> dict:
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        arrays = {key: z[key] for key in z.files if key != "meta"}
    for held in (v for v in VIEWS if f"{v}|naive|recall_new" in arrays):
        for recipe in meta["candidates"]:
            a, b = (arrays[f"{held}|{recipe}|{s}"] for s in ("recall_new", "recall_old"))
            arrays[f"{held}|{recipe}|both"] = (a + b) / 2
    return {"meta": meta, **arrays}


def verdict(pair: dict, held: str, recipe: str, signal: str, *, slack: float = GUARD_STANDARD_ERRORS) -> bool:
    """Whether ``recipe`` is not below the naive merge at any t by ``signal`` on ``held``
    (the guard's test)."""
    a, b = pair[f"{held}|naive|{signal}"], pair[f"{held}|{recipe}|{signal}"]
    diff = b - a
    tol = np.maximum(GUARD_MIN_TOLERANCE, slack * diff.std(0, ddof=1) / np.sqrt(len(diff)))
    return bool((diff.mean(0) >= -tol).all())


def curve_area(pair: dict, held: str, recipe: str, signal: str) -> float:
    return area(pair[f"{held}|{recipe}|{signal}"].mean(0))


def dips(pair: dict, held: str, recipe: str, tolerance: float = 0.01) -> bool:
    m = pair[f"{held}|{recipe}|recall_new"].mean(0)
    return bool((m < m[0] - tolerance).any())


def rule_fit() -> Rule:
    """``rmq fit`` since issue 39 (train/label_free.py, train/holdout.py): a candidate is eligible
    when the guard passes (each held-out query against the whole sample, its hits scored by the
    new model's log rank, not below the naive merge at any t) and its recall curve among the
    holdout does not dip below its start (DIP_TOLERANCE); the best recall area wins (else the best
    that does not dip); the fit keeps it when the guard passes on its own holdout too and its
    recall area beats the naive merge's."""
    from rm_qdrant.core.forecast import DIP_TOLERANCE

    def rule(pair: dict) -> str:
        cands = pair["meta"]["candidates"][1:]
        steady = [c for c in cands if not dips(pair, "inner", c, DIP_TOLERANCE)]
        ok = [c for c in steady if verdict(pair, "inner-g", c, "logrank")]
        best = max(ok or steady or cands[:1], key=lambda c: curve_area(pair, "inner", c, "recall_new"))
        keep = verdict(pair, "outer-g", best, "logrank") and curve_area(
            pair, "outer", best, "recall_new"
        ) > curve_area(pair, "outer", "naive", "recall_new")
        return best if keep else "naive"

    return rule


def rule_today(g: str = "") -> Rule:
    """rmq fit until issue 39: support guard + no dip, best recall_new area; outer: guard and recall
    area (``g``: "-g" judges held-out queries against the whole sample)."""

    def rule(pair: dict) -> str:
        inner, outer = "inner" + g, "outer" + g
        cands = pair["meta"]["candidates"][1:]
        ok = [c for c in cands if verdict(pair, inner, c, "support") and not dips(pair, inner, c)]
        pool = ok or [c for c in cands if not dips(pair, inner, c)] or cands[:1]
        best = max(pool, key=lambda c: curve_area(pair, inner, c, "recall_new"))
        keep = verdict(pair, outer, best, "support") and curve_area(
            pair, outer, best, "recall_new"
        ) > curve_area(pair, outer, "naive", "recall_new")
        return best if keep else "naive"

    return rule


def rule_signal(signal: str, choose_by: str | None = None, also: tuple[str, ...] = (), g: str = "") -> Rule:
    """Eligible: ``signal`` (and every ``also``) not below naive at any t on the inner holdout;
    the best ``choose_by`` area wins; kept when the same holds on the fit's holdout and its
    ``choose_by`` area beats naive's. A name ending in -g or -h overrides ``g`` for that signal
    (-g: held-out queries against the whole sample; -h: against the rest of the holdout)."""
    choose_by = choose_by or signal

    def view(name: str, where: str) -> tuple[str, str]:
        for tail, suffix in (("-g", "-g"), ("-h", "")):
            if name.endswith(tail):
                return name[: -len(tail)], where + suffix
        return name, where + g

    checks = (signal, *also)

    def rule(pair: dict) -> str:
        cands = pair["meta"]["candidates"][1:]
        ok = [
            c
            for c in cands
            if all(verdict(pair, view(s, "inner")[1], c, view(s, "inner")[0]) for s in checks)
        ]
        if not ok:
            return "naive"
        by, where = view(choose_by, "inner")
        best = max(ok, key=lambda c: curve_area(pair, where, c, by))
        by, where = view(choose_by, "outer")
        keep = all(verdict(pair, view(s, "outer")[1], best, view(s, "outer")[0]) for s in checks)
        keep = keep and curve_area(pair, where, best, by) > curve_area(pair, where, "naive", by)
        return best if keep else "naive"

    return rule


RULES: dict[str, Rule] = {"rmq fit now (issue 39)": rule_fit()}
for _g, _how in (("", "holdout vs holdout"), ("-g", "holdout vs sample")):
    RULES |= {
        f"today's rule, {_how}": rule_today(_g),
        f"labels (mAP), {_how}": rule_signal("precision", g=_g),
        f"support guard, chosen by recall vs new, {_how}": rule_signal("support", "recall_new", g=_g),
        f"recall vs new, {_how}": rule_signal("recall_new", g=_g),
        f"recall vs both (mean), {_how}": rule_signal("both", g=_g),
        f"consensus, chosen by recall vs new, {_how}": rule_signal("consensus", "recall_new", g=_g),
        f"consensus + support, chosen by recall vs new, {_how}": rule_signal(
            "consensus", "recall_new", ("support",), g=_g
        ),
    }
RULES |= {
    "recall vs new (sample), chosen by its dense recall": rule_signal("recall_new-g", "new_dense-g"),
    "recall vs new (sample), chosen by recall (holdout)": rule_signal("recall_new-g", "recall_new-h"),
    "recall vs new (sample) + support (holdout), chosen by recall (holdout)": rule_signal(
        "recall_new-g", "recall_new-h", ("support-h",)
    ),
    "dense recall (sample)": rule_signal("new_dense-g"),
    "labels (mAP, sample), chosen by recall (holdout)": rule_signal("precision-g", "recall_new-h"),
}


def ranks(x: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(x, kind="stable"), kind="stable").astype(float)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = ranks(np.asarray(a)), ranks(np.asarray(b))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def served(pair: dict, recipe: str) -> tuple[float, float]:
    m = pair[f"served|{recipe}"]
    return float(m[0]), area(m)


def main() -> None:
    pairs = [load(p) for p in sorted(WORK.glob("*.npz"))]
    pairs = [p for p in pairs if "outer-g|naive|logrank" in p]
    lines = ["# Label-free signals against what is served (issue 39)", ""]
    lines += ["## The pairs (served on the test images, mAP %)", ""]
    lines += [
        "| pair | classes | gallery | Old → New | RM_naive AUC | candidates: t = 0 / AUC |",
        "|---|--:|--:|--:|--:|---|",
    ]
    for p in pairs:
        m = p["meta"]
        old, new, naive = (served(p, r) for r in ("Old", "New", "naive"))
        cells = ", ".join(
            f"{c.split()[-1]}: {100 * served(p, c)[0]:.1f} / {100 * served(p, c)[1]:.1f}"
            for c in m["candidates"][1:]
        )
        lines.append(
            f"| {m['pair']} | {m['classes']} | {m['gallery']} | {100 * old[1]:.1f} → {100 * new[1]:.1f} | "
            f"{100 * naive[1]:.1f} | {cells} |"
        )
    lines += ["", "## Rank correlation within a pair (naive + candidates), mean over pairs", ""]
    lines += ["| signal | holdout | area vs served AUC | t = 0 vs served t = 0 |", "|---|---|--:|--:|"]
    for signal in SIGNALS:
        for held in VIEWS:
            auc_r, t0_r = [], []
            for p in pairs:
                options = p["meta"]["candidates"]
                sig_area = [curve_area(p, held, r, signal) for r in options]
                sig_t0 = [p[f"{held}|{r}|{signal}"].mean(0)[0] for r in options]
                auc_r.append(spearman(sig_area, [served(p, r)[1] for r in options]))
                t0_r.append(spearman(sig_t0, [served(p, r)[0] for r in options]))
            lines.append(f"| {signal} | {held} | {np.nanmean(auc_r):+.2f} | {np.nanmean(t0_r):+.2f} |")
    lines += ["", "## Rules: what each would keep, and what that serves", ""]
    lines += [
        "| rule | kept | bad keeps | worst t = 0 − Old | worst AUC − RM_naive | mean Gain |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    detail = []
    for name, rule in RULES.items():
        kept, bad, t0s, aucs, gains = 0, 0, [], [], []
        row = []
        for p in pairs:
            choice = rule(p)
            old, new, naive = (served(p, r) for r in ("Old", "New", "naive"))
            t0, auc = served(p, choice)
            kept += choice != "naive"
            if choice != "naive":
                t0s.append(t0 - old[0])
                aucs.append(auc - naive[1])
                bad += t0 < old[0] - T0_SLACK or auc < naive[1]
            gains.append(gain(auc, old[1], new[1]))
            row.append(
                f"{p['meta']['pair']}: {choice} "
                f"({100 * (t0 - old[0]):+.1f} t0, {100 * (auc - naive[1]):+.1f} AUC)"
            )
        lines.append(
            f"| {name} | {kept}/{len(pairs)} | {bad} | {100 * min(t0s, default=0):+.1f} | "
            f"{100 * min(aucs, default=0):+.1f} | {100 * np.mean(gains):.0f} % |"
        )
        detail.append(f"- **{name}**: " + "; ".join(row))
    lines += ["", *detail]
    lines += ["", "## Today's rule against rmq fit now, per pair (served, mAP %)", ""]
    lines += [
        "| pair | Old t = 0 | RM_naive AUC | today: kept | t = 0 | AUC | Gain "
        "| now: kept | t = 0 | AUC | Gain |",
        "|---|--:|--:|---|--:|--:|--:|---|--:|--:|--:|",
    ]
    for p in pairs:
        old, new, naive = (served(p, r) for r in ("Old", "New", "naive"))
        cells = []
        for rule in (RULES["today's rule, holdout vs holdout"], RULES["rmq fit now (issue 39)"]):
            choice = rule(p)
            t0, auc = served(p, choice)
            cells.append(
                f"{choice} | {100 * t0:.1f} | {100 * auc:.1f} | {100 * gain(auc, old[1], new[1]):.0f} %"
            )
        lines.append(
            f"| {p['meta']['pair']} | {100 * old[0]:.1f} | {100 * naive[1]:.1f} | " + " | ".join(cells) + " |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    (Path(__file__).parent / "results" / "label-free-signals.md").write_text(text)


if __name__ == "__main__":
    main()
