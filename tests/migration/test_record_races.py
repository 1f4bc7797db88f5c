"""A command that rewrites the pair record after a long step (ranking the gallery, embedding a
calibration sample) must not undo what another command recorded meanwhile: ``rmq switch-encoder
--decode`` is the only way the decode mode changes, and never silently."""

from __future__ import annotations

import pytest

import rm_qdrant
from rm_qdrant import OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.errors import ConfigError, MigrationError
from rm_qdrant.migration import ranking
from rm_qdrant.pair.record import load_pair
from tests.conftest import make_image_folder


def test_a_decode_switch_while_a_migration_ranks_the_gallery_is_kept(store, models, tmp_path, monkeypatch):
    index_images(store, "old", OnnxEncoder(models.old), scan_image_folder(make_image_folder(tmp_path / "g")))
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    real = ranking.order_keys

    def ranking_meanwhile(*args, **kwargs):
        rm_qdrant.switch_encoder(store, "p", decode="fast")  # another operator, while the run ranks
        return real(*args, **kwargs)

    monkeypatch.setattr(ranking, "order_keys", ranking_meanwhile)
    rm_qdrant.migrate(store, "p", order="centroid")
    pair = load_pair(store, "p")
    assert (pair.decode, pair.order, pair.order_ready) == ("fast", "centroid", True)


def test_a_calibration_does_not_undo_a_decode_switch_made_while_it_embedded(
    store, models, tmp_path, monkeypatch
):
    import rm_qdrant.api.calibrating as calibrating

    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=40))
    index_images(store, "old", OnnxEncoder(models.old), items)
    create_pair(
        store,
        "p",
        old_collection="old",
        encoder=OnnxEncoder(models.new_only),
        old_encoder=OnnxEncoder(models.old),
    )
    real = calibrating.draw_with_steps

    def drawing_meanwhile(*args, **kwargs):
        drawn = real(*args, **kwargs)
        rm_qdrant.switch_encoder(store, "p", decode="fast")  # another operator, while it embeds
        return drawn

    monkeypatch.setattr(calibrating, "draw_with_steps", drawing_meanwhile)
    with pytest.raises(ConfigError, match="changed while it was being calibrated"):
        rm_qdrant.calibrate(store, "p", sample=110, holdout=0.5, k=5, force=True)
    pair = load_pair(store, "p")
    assert (pair.decode, pair.calibration) == ("fast", None)
    monkeypatch.setattr(calibrating, "draw_with_steps", real)
    assert rm_qdrant.calibrate(store, "p", sample=110, holdout=0.5, k=5, force=True).kept
    pair = load_pair(store, "p")
    assert pair.decode == "fast" and pair.calibration is not None


@pytest.mark.parametrize("layout", ["paired", "single-collection"])
def test_a_finalize_does_not_undo_a_decode_switch_made_while_it_checked(
    store, models, tmp_path, monkeypatch, layout
):
    from rm_qdrant.pair.layouts import paired, single

    index_images(store, "old", OnnxEncoder(models.old), scan_image_folder(make_image_folder(tmp_path / "g")))
    extra = {"layout": layout, "new_vector": "new"} if layout != "paired" else {}
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm), **extra)
    rm_qdrant.migrate(store, "p")
    module = paired if layout == "paired" else single
    real = module.check_all_moved

    def counting_meanwhile(*args, **kwargs):
        real(*args, **kwargs)
        rm_qdrant.switch_encoder(store, "p", decode="fast")  # another operator, while it counts

    monkeypatch.setattr(module, "check_all_moved", counting_meanwhile)
    with pytest.raises(MigrationError, match=r"pair 'p' changed while finalize ran \(decode\)"):
        rm_qdrant.finalize(store, "p")
    pair = load_pair(store, "p")
    assert (pair.state, pair.decode) == ("backfilling", "fast")  # nothing undone, nothing cut over
    monkeypatch.setattr(module, "check_all_moved", real)
    rm_qdrant.finalize(store, "p")
    assert (load_pair(store, "p").state, load_pair(store, "p").decode) == ("finalized", "fast")


def test_a_rollback_does_not_undo_a_decode_switch_made_while_it_checked_the_old_model(
    store, models, tmp_path, monkeypatch
):
    from rm_qdrant.operations import cutover

    index_images(store, "old", OnnxEncoder(models.old), scan_image_folder(make_image_folder(tmp_path / "g")))
    old = OnnxEncoder(models.old)
    create_pair(
        store, "p", old_collection="old", encoder=OnnxEncoder(models.rm), keep_old=True, old_encoder=old
    )
    rm_qdrant.migrate(store, "p", until=0.5)
    real = cutover._check_old_model

    def checking_meanwhile(*args, **kwargs):
        checked = real(*args, **kwargs)
        rm_qdrant.switch_encoder(store, "p", decode="fast")  # another operator, while it embeds
        return checked

    monkeypatch.setattr(cutover, "_check_old_model", checking_meanwhile)
    with pytest.raises(MigrationError, match=r"pair 'p' changed while rollback ran \(decode\)"):
        rm_qdrant.rollback(store, "p", old_encoder=old)
    pair = load_pair(store, "p")
    assert (pair.state, pair.decode, store.alias("p")) == ("backfilling", "fast", None)
