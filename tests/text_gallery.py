"""A text gallery as a team has one: documents in the payload (``body``), a topic label, vectors
of the old model in a collection ``docs``; and a naive text pair ``t`` over it (old and new
are two seeds of :func:`tests.text_models.text_graph`: two incompatible spaces)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

import rm_qdrant
from rm_qdrant.models.text import TextEncoder, load_encoder
from rm_qdrant.store import Store
from tests.text_models import TOPICS, stamped_text_graph

#: Tokens the test graphs read (:func:`~tests.text_models.stamped_text_graph`), [CLS] and [SEP] included.
MAX_LENGTH = 16


@dataclass(frozen=True)
class TextModels:
    old: Path
    new: Path

    def encoders(self) -> tuple[TextEncoder, TextEncoder]:
        return load_encoder(self.old), load_encoder(self.new)  # type: ignore[return-value]


def text_models(folder: Path) -> TextModels:
    """The old and the new text graph, stamped into ``folder``."""
    return TextModels(stamped_text_graph(folder, "old", seed=1), stamped_text_graph(folder, "new", seed=2))


def long_text(words: int, topic: str, *, seed: int = 0) -> str:
    """A document of ``words`` words of ``topic``, each one token: longer than :data:`MAX_LENGTH`
    - 2 words, the tokenizer cuts it."""
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(TOPICS[topic], size=words))


def text_gallery(
    store: Store,
    models: TextModels,
    docs: list[str],
    labels: list[str],
    *,
    name: str = "t",
    **init: object,
) -> None:
    """``docs`` (ids 0..n-1) embedded by the old model into ``docs``, and a naive pair ``name``."""
    old = load_encoder(models.old)
    vectors = old.encode(docs, ["embedding"])["embedding"]
    store.create_collection("docs", dim=vectors.shape[1], distance="cosine")
    payloads = [{"body": doc, "label": label} for doc, label in zip(docs, labels, strict=True)]
    store.upsert("docs", list(range(len(docs))), vectors, payloads)
    rm_qdrant.init(
        store,
        name,
        old_collection="docs",
        encoder=models.new,
        old_encoder=models.old,
        text_field="body",
        **init,
    )


def text_pair_at(tmp_path: Path, count: int) -> tuple[list[str], list[str], TextModels]:
    """A naive text pair 't' of ``count`` labelled documents (:func:`tests.text_models.texts`) in
    the store at ``tmp_path/q``: the documents, their labels and the models."""
    from rm_qdrant import open_store
    from tests.text_models import texts

    docs, labels = texts(count)
    models = text_models(tmp_path / "models")
    with open_store(tmp_path / "q") as store:
        text_gallery(store, models, docs, labels)
    return docs, labels, models
