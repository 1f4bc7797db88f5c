"""The layout objects' pure answers (no store): which points each half serves, how a search of
old is filtered, whether writes go to old too, what a rollback may do, and what messages say,
for every layout × state."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rm_qdrant.core.planning import MIGRATED
from rm_qdrant.errors import ConfigError, MigrationError
from rm_qdrant.pair.layouts import OneCollection, Paired, PairedKeepOld, layout_of
from rm_qdrant.pair.record import PAIRED, SINGLE, ModelRef, PairRecord
from rm_qdrant.store import Where

STATES = ("backfilling", "finalizing", "finalized", "rolled_back")
MODEL = ModelRef("m", "f" * 16, 8, "/m.onnx")


def _pair(kind: str, state: str = "backfilling") -> PairRecord:
    base = PairRecord("p", "old", "p-new", "rm", "cosine", MODEL, MODEL, state=state, vector="img")
    if kind == "paired":
        return base
    if kind == "keep-old":
        return replace(base, keep_old=True)
    return replace(base, new_collection="old", layout=SINGLE, new_vector="img2")


KINDS = {"paired": Paired, "keep-old": PairedKeepOld, "single": OneCollection}


@pytest.mark.parametrize("kind", KINDS)
def test_the_record_picks_its_layout_class(kind):
    assert type(layout_of(_pair(kind))) is KINDS[kind]


def test_only_the_record_fields_choose_the_layout():
    assert type(layout_of(replace(_pair("keep-old"), layout=PAIRED))) is PairedKeepOld
    assert type(layout_of(replace(_pair("paired"), layout=PAIRED, keep_old=False))) is Paired


@pytest.mark.parametrize("kind", KINDS)
def test_the_halves_partition_the_points(kind):
    """Old serves what new does not: a keep-old copy is hidden by its mark, one collection
    splits on the new vector; two plain collections need no filter."""
    layout = layout_of(_pair(kind))
    expected_old = {
        "paired": Where(),
        "keep-old": Where(must_not={MIGRATED: 1}),
        "single": Where(lacks_vector=("img2",)),
    }[kind]
    expected_new = Where(has_vector=("img2",)) if kind == "single" else Where()
    assert layout.old_where() == expected_old
    assert layout.new_where() == expected_new


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_search_of_old_hides_what_new_serves_only_while_backfilling(kind, state):
    layout = layout_of(_pair(kind, state))
    user = Where(must={"shop": "a"})
    got = layout.old_filter(user)
    if state == "backfilling" and kind != "paired":
        assert got == user & layout.old_where()
        assert layout.old_filter(None) == layout.old_where()
    else:
        assert got is user
        assert layout.old_filter(None) is None


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("kind", KINDS)
def test_writes_go_to_old_too_only_where_a_rollback_can_serve_them(kind, state):
    layout = layout_of(_pair(kind, state))
    assert layout.keeps_writes_in_old == (state == "backfilling" and kind != "paired")


@pytest.mark.parametrize("kind", KINDS)
def test_a_rollback_is_refused_where_old_lost_points_or_was_rolled_back(kind):
    layout = layout_of(_pair(kind))
    if kind == "paired":
        with pytest.raises(MigrationError, match="not --keep-old"):
            layout.check_rollback(None)
    else:
        layout.check_rollback(None)
    if kind != "paired":
        with pytest.raises(MigrationError, match="already rolled back"):
            layout_of(_pair(kind, "rolled_back")).check_rollback(None)


def test_one_collection_rolls_back_only_while_backfilling_and_has_no_alias():
    with pytest.raises(MigrationError, match="no longer serves"):
        layout_of(_pair("single", "finalized")).check_rollback(None)
    with pytest.raises(ConfigError, match="no alias"):
        layout_of(_pair("single")).check_rollback("photos")
    assert layout_of(_pair("single")).rollback_alias("photos") is None
    assert layout_of(_pair("keep-old")).rollback_alias(None) == "p"
    assert layout_of(_pair("keep-old")).rollback_alias("photos") == "photos"


@pytest.mark.parametrize("kind", KINDS)
def test_messages_name_where_each_half_is(kind):
    layout = layout_of(_pair(kind))
    if kind == "single":
        assert layout.arrow == "old: vector 'img' -> 'img2'"
        assert (layout.old_place, layout.new_place) == ("old (vector 'img')", "old (vector 'img2')")
        assert layout.new_model_key == "old/img2"
        assert set(layout.managed) == {"img", "img2"}
        assert layout.one_query and layout.index_vector == "img"
    else:
        assert layout.arrow == "old -> p-new"
        assert layout.created == "old -> p-new (vector 'img')"
        assert (layout.old_place, layout.new_place) == ("old", "p-new")
        assert layout.new_model_key == "p-new"
        assert set(layout.managed) == {"img"}
        assert not layout.one_query and layout.index_vector is None


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("kind", KINDS)
def test_the_old_half_stops_counting_once_its_vectors_stop_serving(kind, state):
    layout = layout_of(_pair(kind, state))
    assert layout.old_ended() == (state in ("finalizing", "finalized"))
    assert layout.finishing_migration() == (kind == "single")
