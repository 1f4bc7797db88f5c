"""DualIndex and AsyncDualIndex on a text pair: a string is a query text, encoded with the
query prefix, and both halves are served as numpy ranks them; what is not text is one error."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import rm_qdrant
from rm_qdrant import AsyncDualIndex, DualIndex, TextError, load_encoder, open_store
from rm_qdrant.models.text_stamp import stamp_text_model
from tests.text_models import text_graph, write_vocab
from tests.text_pairs import documents


@pytest.fixture(scope="module")
def prefixed(tmp_path_factory: pytest.TempPathFactory):
    """Old and new graphs whose queries and documents take different prefixes."""
    folder = tmp_path_factory.mktemp("prefixed")
    vocab = write_vocab(folder / "vocab.txt")
    graphs = []
    for seed, name in ((0, "old"), (1, "new")):
        raw = text_graph(folder / f"{name}-raw.onnx", seed=seed)
        graphs.append(folder / f"{name}.onnx")
        stamp_text_model(
            raw,
            graphs[-1],
            outputs={"embedding": "last_hidden_state"},
            tokenizer=vocab,
            max_length=16,
            query_prefix="big ",
            document_prefix="small ",
        )
    return graphs


def _pair(tmp_path, old, new):
    docs, labels = documents()
    store = open_store(tmp_path / "q", create=True)
    store.create_collection("articles", dim=16, distance="cosine")
    vectors = load_encoder(old).encode(docs)["embedding"]
    store.upsert(
        "articles", list(range(len(docs))), vectors, [{"body": d, "label": x} for d, x in zip(docs, labels)]
    )
    rm_qdrant.init(store, "p", old_collection="articles", encoder=new, old_encoder=old, text_field="body")
    return store, docs


def _ranked(query: np.ndarray, vectors: np.ndarray, ids: list[int], limit: int) -> list[int]:
    scores = vectors @ query / np.linalg.norm(vectors, axis=1) / np.linalg.norm(query)
    return [ids[i] for i in np.argsort(-scores, kind="stable")[:limit]]


def test_a_string_is_a_query_text_on_both_halves_sync_and_async(prefixed, tmp_path):
    old, new = prefixed
    store, docs = _pair(tmp_path, old, new)
    rm_qdrant.migrate(store, "p", until=0.5, batch=8)
    query = "dog cat and puppy"
    with DualIndex.open(store, "p", exact=True) as index:
        hits = index.search(query, limit=40)
        in_new = {h.id for h in hits if h.source == "new"}
        assert 0 < len(in_new) < len(docs)
        # each half ranked as numpy ranks it: the query with its query prefix, the documents with theirs
        q_old = load_encoder(old).encode([query], query=True)["embedding"][0]
        q_new = load_encoder(new).encode([query], query=True)["embedding"][0]
        assert q_old.tolist() != load_encoder(old).encode([query])["embedding"][0].tolist()
        new_docs = sorted(in_new)
        old_docs = sorted(set(range(len(docs))) - in_new)
        expect_new = _ranked(
            q_new, load_encoder(new).encode([docs[i] for i in new_docs])["embedding"], new_docs, 40
        )
        expect_old = _ranked(
            q_old, load_encoder(old).encode([docs[i] for i in old_docs])["embedding"], old_docs, 40
        )
        assert [h.id for h in hits if h.source == "new"] == expect_new[: len(in_new)]
        assert [h.id for h in hits if h.source == "old"] == expect_old[: len(hits) - len(in_new)]

        async def served():
            async with AsyncDualIndex(index) as aindex:
                return await aindex.search(query, limit=40)

        assert [(h.id, h.source) for h in asyncio.run(served())] == [(h.id, h.source) for h in hits]
        for bad in ("", "   ", b"\xff\xfe", 17):
            with pytest.raises(TextError):
                index.search(bad, limit=3)
    store.close()
