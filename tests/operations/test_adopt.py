"""Adopting a team's collection as it is: named vectors, its payload schema, its stores.

The team's collections here are made with plain qdrant-client and qdrant-edge calls,
never with rm-qdrant.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import qdrant_edge as qe
from click.testing import CliRunner
from qdrant_client import QdrantClient
from qdrant_client import models as qm

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, load_pair, open_store, scan_image_folder
from rm_qdrant.cli import cli
from rm_qdrant.core.planning import ERROR
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import rollback
from rm_qdrant.operations.drop import drop_pair
from rm_qdrant.operations.switch import switch_encoder
from rm_qdrant.pair.record import list_pairs
from rm_qdrant.serving.status import pair_status
from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import OLD_DIM, SPEC, make_image_folder

N = 30


def team_rows(models, tmp_path):
    """The team's gallery: integer ids, vectors from the old model, its own payload schema."""
    items = scan_image_folder(make_image_folder(tmp_path / "images", per_class=10))
    vectors = OnnxEncoder(models.old).encode([i.uri for i in items])["embedding"]
    payloads = [
        {"image_url": i.uri, "sku": f"SKU-{k:04d}", "category": i.label, "price": 10 + k}
        for k, i in enumerate(items)
    ]
    return items, vectors, payloads


def team_collection_local(folder, models, tmp_path, *, extra_vector=False):
    """What a team's prototype writes with QdrantClient(path=...): named vector 'image'."""
    items, vectors, payloads = team_rows(models, tmp_path)
    client = QdrantClient(path=str(folder))
    config = {"image": qm.VectorParams(size=OLD_DIM, distance=qm.Distance.COSINE)}
    if extra_vector:
        config["text"] = qm.VectorParams(size=3, distance=qm.Distance.DOT)
    client.create_collection("products", vectors_config=config)
    client.upsert(
        "products",
        [
            qm.PointStruct(id=k, vector={"image": v.tolist()}, payload=p)
            for k, (v, p) in enumerate(zip(vectors, payloads))
        ],
    )
    client.close()
    return items, payloads


def team_shard(store_folder, models, tmp_path):
    """What a team's app writes with qdrant-edge: a shard with a named vector and a payload index."""
    items, vectors, payloads = team_rows(models, tmp_path)
    path = store_folder / "collections" / "products" / "shard"
    path.parent.mkdir(parents=True)
    config = qe.EdgeConfig(vectors={"image": qe.EdgeVectorParams(size=OLD_DIM, distance=qe.Distance.Cosine)})
    shard = qe.EdgeShard.create(str(path), config)
    points = [qe.Point(k, {"image": v.tolist()}, p) for k, (v, p) in enumerate(zip(vectors, payloads))]
    shard.update(qe.UpdateOperation.upsert_points(points))
    shard.update(qe.UpdateOperation.create_field_index("category", qe.PayloadSchemaType.Keyword))
    shard.close()
    return items, payloads


@pytest.fixture(params=["local-folder", "edge-shard"])
def team(request, models, tmp_path):
    """(store location, items, payloads): the team's 'products' collection in either store."""
    folder = tmp_path / "team"
    if request.param == "local-folder":
        items, payloads = team_collection_local(folder, models, tmp_path)
    else:
        items, payloads = team_shard(folder, models, tmp_path)
    return folder, items, payloads


def test_a_teams_collection_is_adopted_as_it_is(team, models):
    folder, items, payloads = team
    with open_store(folder, create=False) as store:
        spec = store.collection("products")
        assert (spec.vector, spec.dim, spec.distance) == ("image", OLD_DIM, "cosine")
        record = create_pair(
            store,
            "p",
            old_collection="products",
            encoder=OnnxEncoder(models.rm),
            uri=UriRule("image_url"),
            label_field="category",
        )
        assert record.vector == "image" and store.collection("p-new").vector == "image"
        assert store.payload_indexes("p-new") == store.payload_indexes("products")
        index = DualIndex.open(store, "p", exact=True)
        run_migration(index, MigrateOptions(batch=7, until=0.5, order="centroid"))
        assert store.count("p-new") == N // 2 and store.count("products") == N // 2
        hits = index.search(items[3].uri, limit=N)
        assert sorted(h.id for h in hits) == list(range(N))  # every id once, integer ids kept
        assert hits[0].id == 3
        by_id = {h.id: h.payload for h in hits}
        assert all(by_id[k] == payloads[k] for k in range(N))  # the team's payload, untouched, no rmq_*
        moved = store.retrieve(
            "p-new", [h.id for h in hits if h.source == "new"], with_vectors=True, vector="image"
        )
        assert moved and all(r.vector is not None and len(r.vector) == 10 for r in moved)


def test_a_qdrant_client_folder_is_opened_through_qdrant_client(models, tmp_path):
    folder = tmp_path / "team"
    team_collection_local(folder, models, tmp_path)
    with open_store(folder) as store:
        assert type(store).__name__ == "ClientStore" and store.list_collections() == ["products"]
        assert not (folder / "collections").exists()  # not mistaken for an empty embedded store


def test_several_named_vectors_need_old_vector(models, tmp_path):
    folder = tmp_path / "team"
    team_collection_local(folder, models, tmp_path, extra_vector=True)
    with open_store(folder) as store:
        with pytest.raises(ConfigError, match="named vectors 'image', 'text': say which one"):
            create_pair(store, "p", old_collection="products", encoder=OnnxEncoder(models.rm))
        with pytest.raises(ConfigError, match=r"has no vector named .img. \(it has .image., .text.\)"):
            store.collection("products", "img")
        assert store.collection("products", "image").dim == OLD_DIM


def test_uri_templates_and_missing_fields(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "images", per_class=10))
    vectors = OnnxEncoder(models.old).encode([i.uri for i in items])["embedding"]
    store.create_collection("products", dim=OLD_DIM, distance="cosine")
    payloads = [{"folder": i.label, "file": i.uri.rsplit("/", 1)[1]} for i in items]
    payloads[0] = {"folder": "a"}  # no file: recorded, the run goes on
    store.upsert("products", list(range(N)), vectors, payloads)
    template = str(tmp_path / "images") + "/{folder}/{file}"
    create_pair(
        store, "p", old_collection="products", encoder=OnnxEncoder(models.rm), uri=UriRule(template=template)
    )
    report = run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    assert (report.moved, report.failed) == (N - 1, 1)
    assert "payload has no 'file' for the uri template" in store.retrieve("products", [0])[0].payload[ERROR]
    with pytest.raises(ConfigError, match="no indexes or conversions"):
        UriRule(template="s3://b/{sku[0]}.jpg")
    with pytest.raises(ConfigError, match="uses no payload field"):
        UriRule(template="s3://b/fixed.jpg")


def test_one_pair_per_old_collection_and_pairs_can_be_listed_and_dropped(store, models, gallery_store):
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    with pytest.raises(ConfigError, match="already belongs to pair 'p'"):
        create_pair(store, "q", old_collection="old", encoder=OnnxEncoder(models.rm), new_collection="q-new")
    assert not store.has_collection("q-new")
    assert [p.name for p in list_pairs(store)] == ["p"]
    run_migration(DualIndex.open(store, "p"), MigrateOptions(limit=5))
    with pytest.raises(ConfigError, match="5 points live in 'p-new' only"):
        drop_pair(store, "p")
    dropped = drop_pair(store, "p", force=True)
    assert not dropped.deleted_new and store.has_collection("p-new") and store.count("old") == N - 5
    assert list_pairs(store) == []
    create_pair(store, "q", old_collection="old", encoder=OnnxEncoder(models.rm))
    assert drop_pair(store, "q").deleted_new and not store.has_collection("q-new")
    assert store.has_collection("old")  # never the team's collection


@pytest.fixture
def gallery_store(store, models, tmp_path):
    from rm_qdrant import index_images

    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=10))
    index_images(store, "old", OnnxEncoder(models.old), items)
    return items


def rm_graph(models, path, *, new_scale=1.0, rev_noise=0.0):
    """An rm graph over the shared models: new = new_scale * φ_new, rev = ψ(new) (+ noise)."""
    rng = np.random.default_rng(11)
    w_rev = models.w_rev / new_scale + rev_noise * rng.normal(size=models.w_rev.shape)
    return linear_encoder(
        path,
        [("new", "pixels", models.w_new * new_scale), ("rev", "new", w_rev)],
        input_spec=SPEC,
        name=path.stem,
    )


def test_a_naive_pair_switches_to_a_trained_graph_only_if_new_stays_valid(
    store, models, gallery_store, tmp_path
):
    create_pair(
        store,
        "p",
        old_collection="old",
        encoder=OnnxEncoder(models.new_only),
        old_encoder=OnnxEncoder(models.old),
    )
    run_migration(DualIndex.open(store, "p"), MigrateOptions(limit=10))
    changed = OnnxEncoder(rm_graph(models, tmp_path / "rho.onnx", new_scale=1.0, rev_noise=0.0))
    rotated = linear_encoder(
        tmp_path / "rotated.onnx",
        [("new", "pixels", models.w_new[:, ::-1]), ("rev", "new", models.w_rev)],
        input_spec=SPEC,
        name="rotated",
    )
    with pytest.raises(ConfigError, match=r"does not reproduce the vectors already in 'p-new' \(cosine min"):
        switch_encoder(store, load_pair(store, "p"), OnnxEncoder(rotated))
    assert load_pair(store, "p").mode == "naive"
    updated, measured = switch_encoder(store, load_pair(store, "p"), changed)
    assert updated.mode == "rm" and measured is not None and measured.checked == 10 and measured.min > 0.999
    index = DualIndex.open(store, "p", encoder=changed)
    run_migration(index, MigrateOptions(batch=50))
    assert store.count("p-new") == N and len(index.search(gallery_store[0].uri, limit=N)) == N


def test_rollback_serves_the_old_model_and_status_says_so(store, models, gallery_store, tmp_path):
    graph = OnnxEncoder(rm_graph(models, tmp_path / "rm2.onnx", rev_noise=0.5))  # rev != the old model
    old = OnnxEncoder(models.old)
    with pytest.raises(ConfigError, match="--keep-old needs --old-encoder"):
        create_pair(store, "p", old_collection="old", encoder=graph, keep_old=True)
    create_pair(store, "p", old_collection="old", encoder=graph, keep_old=True, old_encoder=old)
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(until=0.5))
    rollback(store, index.pair)
    index.refresh()
    query = gallery_store[4].uri
    _, old_side = index.query_vectors([query])
    np.testing.assert_allclose(old_side, old.encode([query])["embedding"], rtol=1e-5, atol=1e-6)
    hits = index.search(query, limit=N)
    assert hits[0].id == gallery_store[4].point_id and hits[0].distance == pytest.approx(0.0, abs=1e-5)
    assert len(hits) == N and {h.source for h in hits} == {"old"}
    reopened = DualIndex.open(store, "p")  # a fresh process loads the old model itself
    assert reopened.search(query, limit=1)[0].id == gallery_store[4].point_id
    status = pair_status(store, load_pair(store, "p"))
    assert (status.old_count, status.new_count, status.fraction, status.kept_count) == (N, N // 2, 0.0, 0)


def test_cli_init_pairs_drop_pair_and_bad_input(models, tmp_path):
    folder = tmp_path / "team"
    team_collection_local(folder, models, tmp_path)

    def rmq(*args, ok=True):
        result = CliRunner().invoke(cli, ["--qdrant", str(folder), *map(str, args)])
        assert (result.exit_code == 0) == ok, result.output
        return result

    out = rmq(
        "init",
        "--name",
        "p",
        "--old-collection",
        "products",
        "--encoder",
        models.rm,
        "--uri-field",
        "image_url",
        "--label-field",
        "category",
    ).output
    assert "(vector 'image')" in out and "payload field 'image_url'" in out
    assert json.loads(rmq("pairs", "--json").output)[0]["uri_field"] == "image_url"
    text = rmq("search", "--name", "p", next((tmp_path / "images").glob("a/*")), "--limit", "3").output
    assert "category" in text.splitlines()[0] and str(tmp_path / "images") in text
    for args, message in [
        (["search", "--name", "p", "x.jpg", "--limit", "-5"], "-5 is not in the range 1<=x<=2147483647"),
        (["init", "--name", "q", "--old-collection", "products", "--encoder", models.rm], "already belongs"),
        (
            [
                "init",
                "--name",
                "q",
                "--old-collection",
                "products",
                "--encoder",
                models.rm,
                "--uri-field",
                "a",
                "--uri-template",
                "{b}",
            ],
            "not both",
        ),
        (["drop-pair", "nope"], "no pair named 'nope'"),
    ]:
        result = rmq(*args, ok=False)
        assert (
            result.exit_code == 1
            and message in result.output
            and len(result.output.strip().splitlines()) == 1
        )
    assert "dropped pair 'p'" in rmq("drop-pair", "p").output


def test_served_evaluation_reads_the_pairs_label_field(team, models):
    from rm_qdrant.evaluation.evaluate import served_retrieval

    folder, items, _ = team
    with open_store(folder) as store:
        create_pair(
            store,
            "p",
            old_collection="products",
            encoder=OnnxEncoder(models.rm),
            uri=UriRule("image_url"),
            label_field="category",
        )
        result = served_retrieval(DualIndex.open(store, "p", exact=True), items)
    assert result.map > 0.3 and result.top1 > 0.5  # the colours of the three classes separate well


def test_collections_with_vectors_a_pair_cannot_carry_are_refused(models, tmp_path):
    """A multivector cannot be merged. (Extra dense or sparse vectors are carried: test_other_vectors.py.)"""
    folder = tmp_path / "team"
    client = QdrantClient(path=str(folder))
    image = qm.VectorParams(size=OLD_DIM, distance=qm.Distance.COSINE)
    client.create_collection(
        "both", vectors_config={"image": image, "text": qm.VectorParams(size=3, distance=qm.Distance.DOT)}
    )
    client.create_collection(
        "sparse", vectors_config={"image": image}, sparse_vectors_config={"bm25": qm.SparseVectorParams()}
    )
    multi = qm.VectorParams(
        size=OLD_DIM,
        distance=qm.Distance.COSINE,
        multivector_config=qm.MultiVectorConfig(comparator=qm.MultiVectorComparator.MAX_SIM),
    )
    client.create_collection("multi", vectors_config={"image": multi})
    client.close()
    with open_store(folder) as store:
        for collection, message in (("multi", "is a multivector"),):
            with pytest.raises(ConfigError, match=re.escape(message)):
                create_pair(
                    store, "p", old_collection=collection, encoder=OnnxEncoder(models.rm), old_vector="image"
                )
            assert not store.has_collection("p-new")


def test_an_alias_names_the_collection_it_points_at(store, models, gallery_store):
    """After one upgrade, the team's name is an alias of the new collection: the next upgrade starts there."""
    store.set_alias("products", "old")
    record = create_pair(store, "p", old_collection="products", encoder=OnnxEncoder(models.rm))
    assert record.old_collection == "old"
    run_migration(DualIndex.open(store, "p"), MigrateOptions(until=0.5))
    status = pair_status(store, load_pair(store, "p"))
    assert (status.old_count, status.new_count) == (N // 2, N // 2)


def test_drop_pair_refuses_a_keep_old_pair_with_user_writes_in_new(store, models, gallery_store):
    create_pair(
        store,
        "p",
        old_collection="old",
        encoder=OnnxEncoder(models.rm),
        keep_old=True,
        old_encoder=OnnxEncoder(models.old),
    )
    index = DualIndex.open(store, "p")
    run_migration(index, MigrateOptions(until=0.5))
    index.upsert_vectors([10**6], np.ones((1, 10), np.float32), [{"by": "user"}])  # lives in new only
    with pytest.raises(ConfigError, match="1 points live in 'p-new' only"):
        drop_pair(store, "p")


def test_search_output_is_safe_for_a_terminal_and_filters_keep_strings(tmp_path, models):
    from rm_qdrant.cli.search import parse_filter

    assert parse_filter(('sku="3"', "n=3", "code=007", "x=-2")) == {
        "sku": "3",
        "n": 3,
        "code": "007",
        "x": -2,
    }
    folder = tmp_path / "team"
    items, _ = team_collection_local(folder, models, tmp_path)
    client = QdrantClient(path=str(folder))
    client.set_payload("products", {"category": "\x1b[31mred\nFAKE row\x07"}, points=[0])
    client.close()
    result = CliRunner().invoke(
        cli,
        [
            "--qdrant",
            str(folder),
            "init",
            "--name",
            "p",
            "--old-collection",
            "products",
            "--encoder",
            str(models.rm),
            "--uri-field",
            "image_url",
            "--label-field",
            "category",
        ],
    )
    assert result.exit_code == 0, result.output
    out = (
        CliRunner()
        .invoke(cli, ["--qdrant", str(folder), "search", "--name", "p", items[0].uri, "--limit", "3"])
        .output
    )
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[31mred\\nFAKE row\\x07" in out


@pytest.mark.slow
@pytest.mark.parametrize("keep_old", [False, True])
@pytest.mark.parametrize("link", ["shard", "collection folder"])
def test_a_linked_shard_is_told_where_its_gallery_goes_and_loses_no_point(models, tmp_path, keep_old, link):
    """A team's qdrant-edge shard adopted through a symbolic link (README "Stores"): a paired
    migration moves each point into the new collection, in the store's folder; init says so
    before, finalize says where the gallery is and what the team's shard still holds. The
    link may be the shard's or its collection folder's: --drop-old removes the link alone."""
    _, payloads = team_shard(tmp_path / "team", models, tmp_path)
    shard = tmp_path / "team" / "collections" / "products" / "shard"
    store = tmp_path / "store"
    if link == "shard":
        (store / "collections" / "products").mkdir(parents=True)
        (store / "collections" / "products" / "shard").symlink_to(shard)
    else:
        (store / "collections").mkdir(parents=True)
        (store / "collections" / "products").symlink_to(shard.parent)

    def rmq(*args):
        result = CliRunner().invoke(cli, ["--qdrant", str(store), *map(str, args)])
        assert result.exit_code == 0, result.output
        return result.output

    kept = ["--keep-old", "--old-encoder", models.old] if keep_old else []
    said = rmq("init", "--name", "up", "--old-collection", "products", "--encoder", models.rm,
               "--uri-field", "image_url", *kept)  # fmt: skip
    assert f"'products' is a shard adopted through a link ({shard})" in said
    new = store / "collections" / "up-new" / "shard"
    assert f"({new})" in said and "keep it" in said
    rmq("migrate", "--name", "up")
    said = rmq("finalize", "--name", "up", "--alias", "products", "--drop-old")
    assert f"the gallery lives in 'up-new', in this store's folder ({new})" in said
    assert f"the team's shard {shard} holds {N if keep_old else 0} point(s)" in said
    assert "--drop-old removed the link to it, not the shard" in said
    assert not (store / "collections" / "products").exists()
    assert sorted(p.name for p in shard.parent.iterdir()) == ["shard"]  # nothing written beside it
    team = qe.EdgeShard.load(str(shard))  # the team's shard is there, unlinked
    assert team.count(qe.CountRequest(exact=True)) == (N if keep_old else 0)
    team.close()
    with open_store(store, create=False) as opened:  # every point the team wrote is served
        served, _ = opened.scroll(opened.alias("products") or "", limit=2 * N)
        assert sorted(r.payload["sku"] for r in served) == sorted(p["sku"] for p in payloads)
