"""A paired layout's new collection indexes the team's fields with the team's settings.

It took only each index's type: a case-sensitive text index became a lowercasing one in the
new collection, and ``MatchText("Red")`` then matched "red" too, but only on migrated points
(found by an adversarial run). Checked on the embedded store, where a team's shard can carry
index settings here (qdrant-client's local mode has no payload indexes).
"""

from __future__ import annotations

import pytest
import qdrant_edge as qe
from qdrant_client import models as qm

from rm_qdrant import DualIndex, create_pair, open_store
from tests.conftest import OLD_DIM
from tests.serving.test_dual import linear_rm_with_dims, unit

N = 40
TITLES = ["Red shirt", "red shirt", "Blue Red cap", "blue cap"]


def payload(i: int) -> dict:
    return {"title": TITLES[i % 4], "shop": f"s{i % 3}"}


@pytest.fixture
def team(tmp_path):
    """The team's shard: a case-sensitive text index and a tenant keyword index."""
    params = qe.EdgeVectorParams(size=OLD_DIM, distance=qe.Distance.Cosine)
    shard = qe.EdgeShard.create(
        str(tmp_path / "store" / "collections" / "photos" / "shard"), qe.EdgeConfig(vectors={"": params})
    )
    gallery = unit(N, OLD_DIM, 1)
    shard.update(
        qe.UpdateOperation.upsert_points([qe.Point(i, gallery[i].tolist(), payload(i)) for i in range(N)])
    )
    shard.update(qe.UpdateOperation.create_field_index("title", qe.TextIndexParams(lowercase=False)))
    shard.update(qe.UpdateOperation.create_field_index("shop", qe.KeywordIndexParams(is_tenant=True)))
    shard.close()
    with open_store(tmp_path / "store") as store:
        yield store, gallery


def test_the_new_collection_gets_the_teams_index_settings_and_filters_alike(team, models):
    store, gallery = team
    pair = create_pair(store, "p", old_collection="photos", encoder=linear_rm_with_dims(models, OLD_DIM))
    schema = store._open(pair.new_collection)[1].info().payload_schema  # what qdrant-edge reports
    assert schema["title"].params.lowercase is False
    assert schema["shop"].params.is_tenant is True
    index = DualIndex.open(store, "p", exact=True)
    moved = [i for i in range(N) if i % 8 < 4]  # every title on both sides
    index.upsert_vectors(moved, gallery[moved], [payload(i) for i in moved])
    red = qm.Filter(must=[qm.FieldCondition(key="title", match=qm.MatchText(text="Red"))])
    q = unit(1, OLD_DIM, 3)[0]
    found = {h.id for h in index.search_vectors(q, q, limit=N, filter=red)}
    assert found == {i for i in range(N) if "Red" in payload(i)["title"].split()}  # case-sensitive both sides
    assert {h.source for h in index.search_vectors(q, q, limit=N, filter=red)} == {"old", "new"}
