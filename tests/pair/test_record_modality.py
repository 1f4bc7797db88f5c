"""A pair records what each model reads: a text model's modality and tokenizer; an image pair's
record keeps the form it always had, so a process of an earlier rm-qdrant still reads it."""

from __future__ import annotations

from pathlib import Path

from rm_qdrant import create_pair, load_encoder, open_store
from rm_qdrant.core.uris import UriRule
from rm_qdrant.pair.record import META_COLLECTION, ModelRef, PairRecord, load_pair
from tests.text_models import stamped_text_graph, texts


def _record_payload(store, name: str) -> dict:
    page, _ = store.scroll(META_COLLECTION, limit=100)
    return next(r.payload for r in page if r.payload.get("kind") == "pair" and r.payload["name"] == name)


def test_an_image_pair_record_has_the_form_it_always_had(tmp_path: Path, models, image_folder):
    from rm_qdrant.operations.indexing import index_images, scan_image_folder

    with open_store(tmp_path / "q", create=True) as store:
        index_images(store, "gallery", load_encoder(models.old), scan_image_folder(image_folder))
        create_pair(store, "p", old_collection="gallery", encoder=load_encoder(models.rm))
        record = _record_payload(store, "p")["record"]
        assert set(record["encoder"]) == {"name", "fingerprint", "dim", "path"}
        assert load_pair(store, "p").encoder.modality == "image"


def test_a_text_pair_records_its_models_modality_and_tokenizer(tmp_path: Path):
    old = stamped_text_graph(tmp_path / "m", "old", seed=0)
    new = stamped_text_graph(tmp_path / "m", "new", seed=1)
    docs = texts(8)[0]
    with open_store(tmp_path / "q", create=True) as store:
        store.create_collection("articles", dim=16, distance="cosine")
        store.upsert(
            "articles",
            list(range(8)),
            load_encoder(old).encode(docs)["embedding"],
            [{"body": d} for d in docs],
        )
        create_pair(
            store,
            "p",
            old_collection="articles",
            encoder=load_encoder(new),
            old_encoder=load_encoder(old),
            uri=UriRule("body", inline=True),
        )
        record = _record_payload(store, "p")["record"]
        sha = load_encoder(new).spec.tokenizer_sha256
        assert (record["encoder"]["modality"], record["encoder"]["tokenizer"]) == ("text", sha)
        assert load_pair(store, "p").old_encoder.modality == "text"


def test_a_reference_with_facts_a_later_version_adds_still_reads():
    raw = {"name": "m", "fingerprint": "f", "dim": 3, "path": "/m.onnx", "modality": "text", "tokenizer": "t"}
    assert ModelRef.from_dict({**raw, "added_later": 1}) == ModelRef("m", "f", 3, "/m.onnx", "text", "t")
    payload = {"kind": "pair", "name": "p", "record": {"encoder": {**raw, "added_later": 1}}}
    payload["record"].update(dict.fromkeys(("old_collection", "new_collection", "mode", "distance"), "x"))
    payload["record"]["name"] = "p"
    assert PairRecord.from_payload(payload).encoder.tokenizer == "t"
