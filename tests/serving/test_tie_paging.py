"""Paging where distances tie (issue 45, item 6): exact-duplicate images sit at equal distances,
and ``offset`` pages of 1 served a point twice and skipped another, though the full list held
every point. Each side's search returns its top ``limit + offset`` by score, and which of several
tied points at the cut it returns is the engine's choice, one that may differ between limits.

A property test against a brute-force reference, on seeded random galleries: a few distinct
vectors, each held by several points (exact duplicates), about half of them migrated to new
with the same vector, so that duplicates are split across old and new; the query is one of the
vectors (a tie at distance 0) or a random one, with and without a filter and a score threshold.
Every distance x pair layout (paired, paired --keep-old, one collection) x store, int, UUID and
mixed ids, and a calibrated naive pair (old distances mapped). Pages of 1, 2 and 3 concatenated
are the full list: each point once, ordered by (distance, id: integers ascending, then UUIDs);
each page is the reference's slice.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rm_qdrant import AsyncDualIndex, DualIndex, OnnxEncoder, create_pair, open_store
from rm_qdrant.core.calibration import Calibration
from rm_qdrant.core.merge import score_to_distance
from rm_qdrant.pair.record import save_pair
from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import OLD_DIM, SPEC, make_image_folder

DISTANCES = ["cosine", "dot", "euclid", "manhattan"]
LAYOUTS = ["paired", "keep-old", "single"]
ID_KINDS = ["int", "uuid", "mixed"]
N, GROUPS = 21, 4  # points, distinct vectors: about five copies of each
CELLS = [
    (distance, layout, ID_KINDS[k % 3])
    for k, (distance, layout) in enumerate(itertools.product(DISTANCES, LAYOUTS))
]
#: A calibration a naive pair's old distances go through (monotone, not the identity).
CALIBRATION = Calibration(old=(0.0, 1.0, 4.0), new=(0.0, 0.5, 6.0))


@pytest.fixture(scope="module")
def encoders(tmp_path_factory) -> dict[str, OnnxEncoder]:
    """An rm graph, a plain new model and an old model, any distance, raw scale (the searches
    below take ready-made vectors: the models only give the collections their sizes)."""
    folder, rng = tmp_path_factory.mktemp("tie-models"), np.random.default_rng(5)
    made = {}
    for name, outputs in [
        ("rm", [("new", "pixels", rng.normal(size=(192, OLD_DIM))), ("rev", "new", np.eye(OLD_DIM))]),
        ("new", [("embedding", "pixels", rng.normal(size=(192, OLD_DIM)))]),
        ("old", [("embedding", "pixels", rng.normal(size=(192, OLD_DIM)))]),
    ]:
        path = linear_encoder(
            folder / f"{name}.onnx", outputs, input_spec=SPEC, name=f"tie-{name}", distance=None, scale="raw"
        )
        made[name] = OnnxEncoder(path)
    return made


def id_key(pid: int | str) -> tuple[int, int]:
    """The reference's order of ids at equal distances: integers, then UUIDs (by value)."""
    return (0, pid) if isinstance(pid, int) else (1, uuid.UUID(pid).int)


def distance_of(query: np.ndarray, vector: np.ndarray, distance: str) -> float:
    q, v = query.astype(np.float64), vector.astype(np.float64)
    if distance == "cosine":
        return float(1 - q @ v / np.linalg.norm(q) / np.linalg.norm(v))
    if distance == "dot":
        return float(-(q @ v))
    if distance == "euclid":
        return float(np.linalg.norm(q - v))
    return float(np.abs(q - v).sum())


def make_ids(rng: np.random.Generator, kind: str) -> list[int | str]:
    """N distinct ids: integers of one to three digits (their text order is not theirs), UUIDs."""
    ints = [int(i) for i in rng.choice(np.arange(1, 400), N, replace=False)]
    uuids = [str(uuid.UUID(int=int(rng.integers(1, 2**62)) << 64 | int(i))) for i in range(N)]
    if kind == "int":
        return ints
    if kind == "uuid":
        return uuids
    return [ints[i] if rng.random() < 0.5 else uuids[i] for i in range(N)]


class Gallery:
    """One random gallery on a pair, and the brute-force reference of its searches."""

    def __init__(self, store, encoders, distance, layout, ids_kind, seed, *, calibrated=False):
        rng = np.random.default_rng(seed)
        self.distance, self.rng = distance, rng
        self.base = rng.normal(size=(GROUPS, OLD_DIM)).astype(np.float32)
        self.group = rng.integers(0, GROUPS, N)
        self.ids = make_ids(rng, ids_kind)
        vectors = self.base[self.group]
        store.create_collection("g", dim=OLD_DIM, distance=distance)
        store.upsert("g", self.ids, vectors, [{"n": i, "k": i % 2} for i in range(N)])
        keeps = layout != "paired" or calibrated
        create_pair(
            store,
            "p",
            old_collection="g",
            encoder=encoders["new" if calibrated else "rm"],
            old_encoder=encoders["old"] if keeps else None,
            keep_old=layout == "keep-old",
            layout="single-collection" if layout == "single" else "paired",
            new_vector="new" if layout == "single" else None,
        )
        index = DualIndex.open(store, "p", exact=True)
        if calibrated:
            save_pair(store, replace(index.pair, calibration=CALIBRATION.as_dict()))
            index.refresh()
        moved = sorted(rng.choice(N, N // 2, replace=False))
        old_vectors = {"old_vectors": vectors[moved]} if keeps else {}
        index.upsert_vectors([self.ids[i] for i in moved], vectors[moved], None, **old_vectors)
        self.index = index
        self.side = ["new" if i in moved else "old" for i in range(N)]
        self.scale = index.pair.old_distance

    def query(self, aimed: bool) -> np.ndarray:
        """One of the gallery's vectors (its copies tie at the closest distance), or a random one
        whose groups' distances are apart (a tie is then an exact duplicate's, on both sides)."""
        while True:
            q = self.base[self.rng.integers(GROUPS)] if aimed else self.rng.normal(size=OLD_DIM)
            q = q.astype(np.float32)
            d = sorted({self._distance(q, g, s) for g in range(GROUPS) for s in ("old", "new")})
            if np.min(np.diff(d)) > 1e-3:
                return q

    def _distance(self, q: np.ndarray, group: int, side: str) -> float:
        d = distance_of(q, self.base[group], self.distance)
        return float(self.scale(np.array(d))) if side == "old" and self.scale is not None else d

    def reference(self, q, keep=None, bound=np.inf) -> list[tuple[int | str, str]]:
        """Every served point the filter keeps within the bound, by (distance, id)."""
        rows = []
        for i in range(N):
            d = self._distance(q, self.group[i], self.side[i])
            if (keep is None or i % 2 == keep) and d <= bound:
                rows.append((round(d, 6), id_key(self.ids[i]), self.ids[i], self.side[i]))
        return [(pid, side) for _, _, pid, side in sorted(rows)]


def pages(index, q, size, **options) -> list[list[tuple[int | str, str]]]:
    got, offset = [], 0
    while True:
        hits = index.search_vectors(q, q, limit=size, offset=offset, **options)
        if not hits:
            return got
        got.append([(h.id, h.source) for h in hits])
        offset += size


def check_paging(gallery: Gallery, q, *, keep=None, threshold=None) -> None:
    """Pages of 1, 2 and 3: each served point once (what the issue saw broken), the full list's
    order, and each page the reference's slice."""
    options = {"filter": None if keep is None else {"k": keep}}
    bound = np.inf
    if threshold is not None:
        options["score_threshold"] = threshold
        bound = score_to_distance(threshold, gallery.distance)
    expected = gallery.reference(q, keep, bound)
    paged = {size: pages(gallery.index, q, size, **options, exact=size != 2) for size in (1, 2, 3)}
    for size, got in paged.items():
        served = sorted(id_key(pid) for page in got for pid, _ in page)
        assert served == sorted(id_key(pid) for pid, _ in expected), f"pages of {size}: a repeat or a skip"
    full = gallery.index.search_vectors(q, q, limit=N, **options)
    assert [(h.id, h.source) for h in full] == expected
    for size, got in paged.items():
        assert got == [expected[k : k + size] for k in range(0, len(expected), size)], f"pages of {size}"


def threshold_between(gallery: Gallery, q) -> float:
    """A score threshold between the query's third and fourth groups (tied points in, some out)."""
    d = sorted({gallery._distance(q, g, "new") for g in range(GROUPS)})
    cut = (d[2] + d[3]) / 2
    return {"cosine": 1 - cut, "dot": -cut}.get(gallery.distance, cut)


@pytest.mark.slow
@pytest.mark.parametrize(("distance", "layout", "ids_kind"), CELLS)
def test_pages_of_tied_points_are_the_reference_slices(store, encoders, distance, layout, ids_kind):
    gallery = Gallery(
        store,
        encoders,
        distance,
        layout,
        ids_kind,
        seed=len(CELLS) + CELLS.index((distance, layout, ids_kind)),
    )
    check_paging(gallery, gallery.query(aimed=True))
    q = gallery.query(aimed=False)
    check_paging(gallery, q, keep=0, threshold=threshold_between(gallery, q))
    # a batch whose rows tie at different places: each row is asked again as it needs
    queries = np.stack([gallery.query(aimed=True), q, gallery.query(aimed=True)])
    expected = [gallery.reference(row) for row in queries]
    for offset in range(0, N, 2):
        rows = gallery.index.search_vectors_batch(queries, queries, limit=2, offset=offset)
        assert [[(h.id, h.source) for h in row] for row in rows] == [e[offset : offset + 2] for e in expected]
    gallery.index.close()


@pytest.mark.parametrize("layout", ["paired", "single"])
def test_pages_of_a_calibrated_pair(store, encoders, layout):
    """A naive pair's old distances go through its calibration: ties among old's duplicates stay."""
    gallery = Gallery(store, encoders, "euclid", layout, "mixed", seed=3, calibrated=True)
    assert gallery.scale is not None
    check_paging(gallery, gallery.query(aimed=True))
    check_paging(gallery, gallery.query(aimed=False), keep=1)
    gallery.index.close()


def test_rmq_search_offset_and_async_pages_of_duplicate_images(rmq, models, tmp_path):
    """The reported case end to end: a gallery with copies of the same photos, some of each
    rewritten by the application (so in new), paged one hit at a time by ``rmq search --offset``
    and two at a time by AsyncDualIndex."""
    folder = make_image_folder(tmp_path / "images", per_class=3)
    for k, image in enumerate(sorted(folder.glob("a/*"))[:2]):
        for copy in range(3):
            shutil.copy(image, folder / "a" / f"copy-{k}-{copy}{image.suffix}")
    rmq("index", "--collection", "gallery", "--data", folder, "--encoder", models.old)
    rmq("init", "--name", "demo", "--old-collection", "gallery", "--encoder", models.rm)
    query = sorted(folder.glob("a/*"))[0]  # a/000.jpg: it and its three copies tie at distance 0
    with open_store(tmp_path / "q") as store:
        points = store.scroll("gallery", limit=100)[0]
        by_name = {Path(r.payload["uri"]).relative_to(folder).as_posix(): r.id for r in points}
        moved = ["a/copy-0-0.jpg", "a/copy-0-2.jpg", "a/copy-1-1.png", "a/001.png", "b/000.jpg"]
        DualIndex.open(store, "demo").upsert([by_name[name] for name in moved], [folder / n for n in moved])

    def search(*args: object) -> list[tuple[object, str]]:
        out = rmq("search", "--name", "demo", query, "--exact", "--json", *args).output
        return [(h["id"], h["source"]) for h in json.loads(out)]

    every = search("--limit", "100")
    assert len(every) == 9 + 6 and len({pid for pid, _ in every}) == len(every)
    ties = {by_name[f"a/{name}"] for name in ("000.jpg", "copy-0-0.jpg", "copy-0-1.jpg", "copy-0-2.jpg")}
    assert {pid for pid, _ in every[:4]} == ties and {side for _, side in every[:4]} == {"old", "new"}
    ones = [hit for offset in range(6) for hit in search("--limit", "1", "--offset", offset)]
    assert ones + search("--limit", "100", "--offset", "6") == every

    async def pages() -> list[tuple[object, str]]:
        with open_store(tmp_path / "q") as store:
            index = await AsyncDualIndex.open(store, "demo", exact=True)
            got = [await index.search(query, limit=2, offset=k) for k in range(0, len(every), 2)]
            await index.close()
        return [(h.id, h.source) for page in got for h in page]

    assert asyncio.run(pages()) == every
