"""A text pair's pieces for CLI tests: stamped small text graphs (:mod:`tests.text_models`), a
gallery of their documents in the ``rmq`` fixture's store, and what that store holds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rm_qdrant import load_encoder, open_store
from rm_qdrant.models.text_stamp import stamp_text_model
from tests.text_models import rm_text_graph, text_graph, texts, vocabulary, write_vocab

#: One document longer than a search table shows (80 characters).
LONG = "the big old dog and the small new cat " * 4


@dataclass(frozen=True)
class TextModels:
    """Stamped graphs: ``old`` and ``new`` (two spaces), ``rm`` (new's states and, as ``rev``,
    old's), ``retokenized`` (new's graph with another tokenizer), and the raw graphs."""

    folder: Path
    vocab: Path
    old: Path
    new: Path
    rm: Path
    retokenized: Path
    new_raw: Path
    pooled_raw: Path


def stamp(raw: Path, out: Path, vocab: Path, **roles: str) -> Path:
    outputs = roles or {"embedding": "last_hidden_state"}
    stamp_text_model(raw, out, outputs=outputs, tokenizer=vocab, max_length=16, name=out.stem)
    return out


def make_text_models(folder: Path) -> TextModels:
    """The graphs of :class:`TextModels`, written in ``folder``."""
    vocab = write_vocab(folder / "vocab.txt")
    old_raw, new_raw = (
        text_graph(folder / "old-raw.onnx", seed=0),
        text_graph(folder / "new-raw.onnx", seed=1),
    )
    words = vocabulary()
    shuffled = folder / "shuffled.txt"  # the same words, other ids: another tokenizer
    shuffled.write_text("\n".join(words[:5] + words[:4:-1]) + "\n")
    rm_raw = rm_text_graph(folder / "rm-raw.onnx", new=new_raw, old=old_raw)
    return TextModels(
        folder,
        vocab,
        stamp(old_raw, folder / "old.onnx", vocab),
        stamp(new_raw, folder / "new.onnx", vocab),
        stamp(rm_raw, folder / "rm.onnx", vocab, new="new_states", rev="rev_states"),
        stamp(new_raw, folder / "retokenized.onnx", shuffled),
        new_raw,
        text_graph(folder / "pooled-raw.onnx", seed=1, pooled=True),
    )


def documents() -> tuple[list[str], list[str]]:
    docs, labels = texts(39)
    return [*docs, LONG], [*labels, "animals"]


def gallery(tmp_path: Path, tm: TextModels, *collections: str, files: bool = False) -> np.ndarray:
    """Collections of the old model's vectors of :func:`documents` in the ``rmq`` fixture's store:
    the text in payload ``body`` (``files``: in text files named by payload ``uri``)."""
    docs, labels = documents()
    vectors = load_encoder(tm.old).encode(docs)["embedding"]
    (tmp_path / "docs").mkdir(exist_ok=True)
    payloads = []
    for i, (doc, label) in enumerate(zip(docs, labels, strict=True)):
        (tmp_path / "docs" / f"{i}.txt").write_text(doc, encoding="utf-8")
        where = {"uri": str(tmp_path / "docs" / f"{i}.txt")} if files else {"body": doc}
        payloads.append({**where, "label": label})
    with open_store(tmp_path / "q", create=True) as store:
        for name in collections or ("articles",):
            store.create_collection(name, dim=vectors.shape[1], distance="cosine")
            store.upsert(name, list(range(len(docs))), vectors, payloads)
    return vectors


def store_state(tmp_path: Path) -> tuple[list[str], int]:
    """The store's collections and how many points its pair records hold."""
    with open_store(tmp_path / "q") as store:
        names = sorted(store.list_collections())
        records = store.count("rmq_meta") if "rmq_meta" in names else 0
    return names, records
