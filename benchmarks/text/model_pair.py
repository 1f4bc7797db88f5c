"""Is the bundled text pair a meaningful upgrade? mAP of each model, across the two, and speed.

Embeds the bundled corpus (``rm_qdrant.evaluation.text_corpus``) with both pinned models,
using ONNX Runtime and ``tokenizers`` directly: each model's own maximum length, padding to
the longest text of the batch, the attention-masked mean of the token states (or the
graph's own pooled output, checked to be that mean), then L2 normalisation. Prints:

- mAP over the full ranking (and top-1) of the 1,000 held-out queries against the 6,000
  gallery documents, same label relevant: old→old, new→new, and the two cross-model
  systems (new query → old gallery must be near chance: the spaces are unrelated);
- the same for old→old and new→new with the repository's own protocol (every gallery
  document a query against the rest, :func:`rm_qdrant.core.metrics.retrieval`);
- texts/s of each model at batch 64 on this machine's cores, tokenising included and
  encoder alone (the best of 3 passes over 2,048 texts), and how long the texts are in tokens;
- RM_naive's held-out mAP at t = 0, 0.1, ..., 1 (random order): the curve the demo starts from;
- for the old graph, how far its pooled output ``461`` is from the masked mean of its
  token states ``onnx::Shape_422``.

The demo is worth running when new→new is at least 3 mAP points above old→old.

Run: ``python benchmarks/text/model_pair.py [--corpus FILE.jsonl.gz] [--batch 64] [--repeats 3]
[--sample 2048] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rm_qdrant.core.metrics import FRACTIONS, migrated_at, retrieval  # noqa: E402
from rm_qdrant.evaluation.text_corpus import (  # noqa: E402
    TextModel,
    load_text_corpus,
    read_text_corpus,
    text_demo_models,
)

L3_TOKENS = "onnx::Shape_422"


def tokenizer_for(path: Path, max_length: int) -> Tokenizer:
    """The shared tokenizer as one model needs it: truncated at ``max_length``, padded to the batch."""
    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(max_length=max_length)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest of the batch, not the file's fixed 128
    return tok


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds(tok: Tokenizer, texts: list[str], model: TextModel) -> dict[str, np.ndarray]:
    enc = tok.encode_batch(texts)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64)}
    if model.token_type_ids:
        feed["token_type_ids"] = np.zeros_like(ids)
    return feed


def masked_mean(states: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float32)
    return (states * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0)


def pooled(sess: ort.InferenceSession, feed: dict[str, np.ndarray], model: TextModel) -> np.ndarray:
    (out,) = sess.run([model.output], feed)
    return out if model.pooling == "output" else masked_mean(out, feed["attention_mask"])


def embed(
    sess: ort.InferenceSession, tok: Tokenizer, model: TextModel, texts: tuple[str, ...], batch: int
) -> tuple[np.ndarray, float, float]:
    """Unit embeddings of ``texts``, the seconds spent tokenising and the seconds in the encoder."""
    parts, t_tok, t_enc = [], 0.0, 0.0
    for start in range(0, len(texts), batch):
        t0 = time.perf_counter()
        feed = feeds(tok, list(texts[start : start + batch]), model)
        t1 = time.perf_counter()
        parts.append(pooled(sess, feed, model))
        t_tok, t_enc = t_tok + t1 - t0, t_enc + time.perf_counter() - t1
    x = np.concatenate(parts)
    return x / np.linalg.norm(x, axis=1, keepdims=True), t_tok, t_enc


def embed_and_time(
    model: TextModel, tokenizer: Path, texts: tuple[str, ...], *, batch: int, repeats: int, sample: int
) -> tuple[np.ndarray, dict]:
    """Embeddings of all ``texts``, and texts/s as the best of ``repeats`` passes over the first
    ``sample`` (a shared machine's load only ever slows a pass down)."""
    sess, tok = session(model.path), tokenizer_for(tokenizer, model.max_length)
    pooled(sess, feeds(tok, list(texts[:batch]), model), model)  # warm-up: first-run allocations
    x, _, _ = embed(sess, tok, model, texts, batch)
    runs = [embed(sess, tok, model, texts[:sample], batch)[1:] for _ in range(repeats)]
    t_tok, t_enc = min(runs, key=sum)
    n = len(texts[:sample])
    return x, {"texts_per_s": n / (t_tok + t_enc), "encoder_texts_per_s": n / t_enc, "tokenize_s": t_tok}


def heldout_map(
    q: np.ndarray, g: np.ndarray, q_labels: np.ndarray, g_labels: np.ndarray
) -> tuple[float, float]:
    """mAP over the full ranking and top-1 of queries against a gallery they are not in."""
    return ranked_map(q @ g.T, q_labels, g_labels)


def ranked_map(sim: np.ndarray, q_labels: np.ndarray, g_labels: np.ndarray) -> tuple[float, float]:
    """mAP and top-1 of a query x gallery similarity matrix (larger is nearer)."""
    order = np.argsort(-sim, axis=1, kind="stable")
    relevant = g_labels[order] == q_labels[:, None]
    hits = np.cumsum(relevant, axis=1)
    ranks = np.arange(1, sim.shape[1] + 1)
    ap = (relevant * hits / ranks).sum(axis=1) / np.maximum(relevant.sum(axis=1), 1)
    return float(ap.mean()), float(relevant[:, 0].mean())


def naive_curve(vectors: dict, q_labels: np.ndarray, g_labels: np.ndarray, *, seed: int = 0) -> list[float]:
    """RM_naive's held-out mAP at t = 0, 0.1, ..., 1: the gallery migrates in a seeded random
    order, each query ranks migrated items by new/new cosine and the rest by old/old."""
    (q_old, g_old), (q_new, g_new) = vectors["old"], vectors["new"]
    sim_old, sim_new = q_old @ g_old.T, q_new @ g_new.T
    order = np.random.default_rng(seed).permutation(len(g_labels))
    maps = []
    for t in FRACTIONS:
        moved = migrated_at(order, t)
        maps.append(ranked_map(np.where(moved[None, :], sim_new, sim_old), q_labels, g_labels)[0])
    return maps


def alignment(old: np.ndarray, new: np.ndarray, *, nearest_of: int = 2000) -> dict:
    """How far the two spaces share a geometry: cos(old(x), new(x)) against two different texts
    (a seeded shuffle), and how often old(x)'s nearest of the first ``nearest_of`` new vectors
    is new(x)."""
    other = np.random.default_rng(0).permutation(len(old))
    n = min(nearest_of, len(old))
    nearest = (old[:n] @ new[:n].T).argmax(axis=1)
    return {
        "cos_same_text": float((old * new).sum(axis=1).mean()),
        "cos_other_text": float((old * new[other]).sum(axis=1).mean()),
        "nearest_is_same_text": float((nearest == np.arange(n)).mean()),
        "nearest_of": n,
    }


def per_class_gain(vectors: dict, q_labels: np.ndarray, g_labels: np.ndarray) -> dict[str, float]:
    """Held-out mAP of new->new minus old->old, class by class."""
    by_system = {}
    for name in ("old", "new"):
        q, g = vectors[name]
        by_system[name] = {
            label: ranked_map(q[q_labels == label] @ g.T, q_labels[q_labels == label], g_labels)[0]
            for label in sorted(set(q_labels))
        }
    return {label: by_system["new"][label] - by_system["old"][label] for label in by_system["old"]}


def l3_pooling_gap(model: TextModel, tokenizer: Path, texts: tuple[str, ...], batch: int) -> float:
    """Largest |461 - masked mean of the token states| over ``texts``."""
    sess, tok = session(model.path), tokenizer_for(tokenizer, model.max_length)
    gap = 0.0
    for start in range(0, len(texts), batch):
        feed = feeds(tok, list(texts[start : start + batch]), model)
        out, states = sess.run([model.output, L3_TOKENS], feed)
        gap = max(gap, float(np.abs(out - masked_mean(states, feed["attention_mask"])).max()))
    return gap


def token_counts(model: TextModel, tokenizer: Path, texts: tuple[str, ...]) -> dict:
    """The longest text in tokens ([CLS] and [SEP] included) and how many are cut at max_length."""
    tok = Tokenizer.from_file(str(tokenizer))
    tok.no_truncation()
    tok.no_padding()
    lengths = [len(e.ids) for e in tok.encode_batch(list(texts))]
    cut = sum(n > model.max_length for n in lengths)
    return {"max_length": model.max_length, "longest": max(lengths), "truncated": cut}


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    return f"{os.cpu_count()}-core {model or platform.processor() or 'CPU'}"


def measure(corpus_path: Path | None, *, batch: int, repeats: int, sample: int) -> dict:
    load_before = os.getloadavg()[0]
    corpus = load_text_corpus() if corpus_path is None else read_text_corpus(corpus_path)
    models = text_demo_models()
    texts = corpus.gallery.texts + corpus.queries.texts
    n_g = len(corpus.gallery.texts)
    gl, ql = np.array(corpus.gallery.labels), np.array(corpus.queries.labels)
    vectors, speed = {}, {}
    pairs = (("old", models.old), ("new", models.new))
    for name, model in pairs:
        x, speed[name] = embed_and_time(
            model, models.tokenizer, texts, batch=batch, repeats=repeats, sample=sample
        )
        vectors[name] = (x[n_g:], x[:n_g])
    systems = {}
    for q, g in (("old", "old"), ("new", "new"), ("new", "old"), ("old", "new")):
        systems[f"{q}->{g}"] = heldout_map(vectors[q][0], vectors[g][1], ql, gl)
    naive = naive_curve(vectors, ql, gl)
    loo = {name: retrieval(vectors[name][1], vectors[name][1], gl) for name in ("old", "new")}
    return {
        "corpus": {"gallery": n_g, "queries": len(ql), "classes": len(corpus.classes)},
        "heldout": {k: {"map": m, "top1": t} for k, (m, t) in systems.items()},
        "leave_one_out": {k: {"map": r.map, "top1": r.top1} for k, r in loo.items()},
        "rm_naive_heldout_map": naive,
        "per_class_gain": per_class_gain(vectors, ql, gl),
        "alignment": alignment(np.concatenate(vectors["old"][::-1]), np.concatenate(vectors["new"][::-1])),
        "chance_map": float(np.mean([(gl == label).mean() for label in ql])),
        "speed": speed,
        "tokens": {name: token_counts(m, models.tokenizer, texts) for name, m in pairs},
        "l3_pooled_vs_masked_mean": l3_pooling_gap(models.old, models.tokenizer, texts[:1024], batch),
        "batch": batch,
        "speed_passes": f"best of {repeats} passes over {min(sample, len(texts))} texts",
        "machine": machine(),
        "onnxruntime": ort.__version__,
        "load": f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after",
        "date": time.strftime("%Y-%m-%d"),
    }


def report(r: dict) -> str:
    c, held, loo = r["corpus"], r["heldout"], r["leave_one_out"]
    lines = [
        f"corpus: {c['gallery']} gallery + {c['queries']} held-out queries, {c['classes']} classes",
        "",
        "| query -> gallery | mAP, held-out | top-1, held-out | mAP, leave-one-out | top-1, leave-one-out |",
        "|---|--:|--:|--:|--:|",
    ]
    for name, s in held.items():
        own = loo.get(name.split("->")[0]) if name in ("old->old", "new->new") else None
        tail = f"{100 * own['map']:.1f} | {100 * own['top1']:.1f}" if own else "- | -"
        lines.append(f"| {name} | {100 * s['map']:.1f} | {100 * s['top1']:.1f} | {tail} |")
    margin = 100 * (held["new->new"]["map"] - held["old->old"]["map"])
    lines += [
        "\nRM_naive, held-out mAP as the gallery migrates (random order, seed 0):",
        "",
        "| t | " + " | ".join(f"{t:g}" for t in FRACTIONS) + " |",
        "|---|" + "--:|" * len(FRACTIONS),
        "| RM_naive | " + " | ".join(f"{100 * m:.1f}" for m in r["rm_naive_heldout_map"]) + " |",
    ]
    worse = {k: v for k, v in r["per_class_gain"].items() if v < 0}
    best = max(r["per_class_gain"].items(), key=lambda kv: kv[1])
    a = r["alignment"]
    lines += [
        f"\nper class, new->new minus old->old: above in {len(r['per_class_gain']) - len(worse)} of "
        f"{len(r['per_class_gain'])} (most: {best[0]} {100 * best[1]:+.1f}); below in "
        + (
            ", ".join(f"{k} {100 * v:+.1f}" for k, v in sorted(worse.items(), key=lambda kv: kv[1])) or "none"
        ),
        f"the two spaces: cos(old(x), new(x)) {a['cos_same_text']:.2f} on average, "
        f"{a['cos_other_text']:.2f} for two different texts; old(x)'s nearest of {a['nearest_of']} "
        f"new vectors is new(x) for {100 * a['nearest_is_same_text']:.0f} %",
    ]
    lines += [
        f"\nchance mAP (the query's class's share of the gallery): {100 * r['chance_map']:.1f}",
        f"new->new minus old->old: {margin:+.1f} mAP points (held-out)",
        "",
        f"texts/s at batch {r['batch']}, {r['speed_passes']}:",
        "",
        "| model | max length | longest text, tokens | truncated | texts/s | texts/s, encoder alone |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for name, s in r["speed"].items():
        t = r["tokens"][name]
        lines.append(
            f"| {name} | {t['max_length']} | {t['longest']} | {t['truncated']} | "
            f"{s['texts_per_s']:.0f} | {s['encoder_texts_per_s']:.0f} |"
        )
    gap = r["l3_pooled_vs_masked_mean"]
    lines.append(f"\nold graph: output 461 vs the masked mean of {L3_TOKENS}: max abs diff {gap:.1e}")
    lines.append(f"{r['date']}, {r['machine']}, onnxruntime {r['onnxruntime']}, load {r['load']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus", type=Path, help="a corpus in the bundled format (default: the bundled one)"
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes; the best is reported")
    parser.add_argument("--sample", type=int, default=2048, help="texts per timed pass")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    result = measure(args.corpus, batch=args.batch, repeats=args.repeats, sample=args.sample)
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
