"""A pair's decode mode as its record keeps it: saved and read back, ``exact`` for a record written
before the field existed, and one clear error for a mode this rm-qdrant does not know."""

from __future__ import annotations

import dataclasses

import pytest

import rm_qdrant
from rm_qdrant import ConfigError, OnnxEncoder
from rm_qdrant.pair.record import _get, _put, load_pair, save_pair


def _gallery(store, models, image_folder) -> None:
    rm_qdrant.index(store, image_folder, encoder=models.old, collection="gallery")


def test_the_decode_mode_is_saved_with_the_pair_and_exact_by_default(store, models, image_folder):
    _gallery(store, models, image_folder)
    fast = rm_qdrant.init(store, "fast", old_collection="gallery", encoder=models.rm, decode="fast").pair
    assert fast.decode == "fast" and load_pair(store, "fast").decode == "fast"
    rm_qdrant.drop_pair(store, "fast")
    # an encoder that decodes fast does not make the pair fast: only decode= does
    given = OnnxEncoder(models.rm, decode="fast")
    assert rm_qdrant.init(store, "plain", old_collection="gallery", encoder=given).pair.decode == "exact"
    assert load_pair(store, "plain").decode == "exact"
    assert rm_qdrant.status(store, "plain").status.decode == "exact"


def test_a_record_saved_before_the_field_existed_reads_exact(store, models, image_folder):
    _gallery(store, models, image_folder)
    rm_qdrant.init(store, "p", old_collection="gallery", encoder=models.rm, decode="fast")
    payload = _get(store, "pair", "p")
    del payload["record"]["decode"]
    _put(store, "pair", "p", payload)
    assert load_pair(store, "p").decode == "exact"


def test_an_unknown_decode_mode_in_a_stored_record_is_one_clear_error_and_can_be_repaired(
    store, models, image_folder
):
    _gallery(store, models, image_folder)
    record = rm_qdrant.init(store, "p", old_collection="gallery", encoder=models.rm).pair
    save_pair(store, dataclasses.replace(record, decode="lossy"))
    assert [p.name for p in rm_qdrant.list_pairs(store)] == ["p"]  # still listed, for every pair
    with pytest.raises(ConfigError) as raised:
        rm_qdrant.DualIndex.open(store, "p")
    assert str(raised.value).startswith("pair 'p' records decode 'lossy', which this rm-qdrant does not know")
    assert "--decode exact" in str(raised.value) and "\n" not in str(raised.value)
    rm_qdrant.switch_encoder(store, "p", decode="exact")  # the repair the error names
    assert load_pair(store, "p").decode == "exact"
    with rm_qdrant.DualIndex.open(store, "p") as index:
        assert index.search(next(image_folder.rglob("*.png")), limit=1)


def test_init_with_an_unknown_decode_mode_writes_nothing(store, models, image_folder):
    _gallery(store, models, image_folder)
    with pytest.raises(ConfigError, match="unknown decode 'slow'; expected one of exact, fast"):
        rm_qdrant.init(store, "p", old_collection="gallery", encoder=models.rm, decode="slow")
    assert rm_qdrant.list_pairs(store) == [] and not store.has_collection("p-new")
