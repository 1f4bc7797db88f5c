"""Issue 23's matrix: correct results for every deployment shape, by design rather than by case.

Axes: modality (an image gallery, or a text one) x distance (cosine, dot, euclid) x the models'
scale (unit, raw) x vector layout (one unnamed vector; one named; several: the searched vector
beside a dense 'text' and a sparse 'bm25') x pair layout (paired, paired --keep-old,
single-collection) x ids (int, UUID), each cell on qdrant-edge or on qdrant-client's local mode,
migrated by the local engine or by ``--engine ray`` (a local Ray: fetch, decode and encode in Ray
workers). A text gallery's documents are in a payload field (``body``), a nested one
(``doc.body``) or UTF-8 files its payload names (``doc_url``); its queries are strings. Which
cells run: ``tests/shapes.py`` :func:`design` (by default 27: every distance x scale x pair
layout of images and every distance x pair layout of texts, the other axes chosen so that every
pair of values of any two axes is in some cell; ``RMQ_SHAPES=full``: all 216).

An image cell calls rm-qdrant's operations as ``rmq`` does; a text cell calls the Python API
(``rm_qdrant.init(text_field=...)``, ``migrate``, ``switch_encoder``, ``finalize``,
``rollback``), whose CLI forms (``rmq init --text-field``, ``rmq search --text``, ``rmq model
stamp --tokenizer``) tests/cli/test_cli_text.py covers.

Each cell plays a team's upgrade: init (naive: the plain new model and the old one), migrate
to 0.5, calibrate (raw scales: the map ``rmq calibrate`` fits), the application's updates,
adds and deletes through DualIndex, switch-encoder to the rm graph in half the cells (its
``new`` is the plain new model's output, its ``rev`` = ψ(new) the old model's exactly), a
later write, then migrate all and finalize (old dropped where the graphs state the distance),
or roll back. After every step:

- each id of the gallery is stored once where it serves (and, while a rollback is possible,
  its old copy is there too), nothing else is stored there, and a search with no limit returns
  each id once;
- each served payload, text and bm25 vector is what the team (or the application) wrote;
- every vector rm-qdrant wrote is the encoder's output for the point's current image or text
  (the old model's in old, the new model's in new; cosine collections store them normalised; a
  text is encoded as a document, with the document prefix, a query with the query prefix);
- the merged top k (and the full ranking) equals a brute-force numpy merge: the new query
  vector against the points served from new, the old-side query (the old model's, or rev)
  against the points served from old, old distances through the pair's calibration while it
  applies, merged by distance (ties compared as distances, not ids).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import rm_qdrant
from rm_qdrant import DualIndex, MigrationReport, OnnxEncoder, create_pair, open_store
from rm_qdrant.core.calibration import Calibration, fit_calibration
from rm_qdrant.core.uris import UriRule
from rm_qdrant.evaluation.probe import draw_sample
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.migration.ray_engine import RayOptions
from rm_qdrant.operations.cutover import finalize, rollback
from rm_qdrant.operations.switch import switch_encoder
from rm_qdrant.pair.record import save_pair
from tests import shapes
from tests.shapes import TEXT, TEXT_SOURCE, VECTOR_NAME, Cell, Point, design

K = 5
CELLS = [Cell(**values) for values in design()]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, shapes.Corpus]:
    return {
        "image": shapes.make_images(tmp_path_factory.mktemp("shape-images")),
        "text": shapes.make_texts(tmp_path_factory.mktemp("shape-texts")),
    }


@pytest.fixture(scope="module")
def model_sets(tmp_path_factory, corpora):
    made: dict[tuple[str, str, str, bool], shapes.Models] = {}
    makers = {"image": shapes.make_models, "text": shapes.make_text_models}

    def get(modality: str, distance: str, scale: str, stated: bool) -> shapes.Models:
        key = (modality, distance, scale, stated)
        if key not in made:
            folder = tmp_path_factory.mktemp(f"models-{modality}-{distance}-{scale}-{int(stated)}")
            models = makers[modality](folder, distance, scale, stated=stated)
            made[key] = shapes.embed(models, corpora[modality].every)
        return made[key]

    return get


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def metric(query: np.ndarray, vector: np.ndarray, distance: str) -> float:
    q, v = query.astype(np.float64), vector.astype(np.float64)
    if distance == "cosine":
        return float(1.0 - _unit(q) @ _unit(v))
    if distance == "dot":
        return float(-(q @ v))
    return float(np.linalg.norm(q - v))


class Run:
    """One cell's upgrade, and the state the team expects after each step."""

    def __init__(self, cell: Cell, store, models: shapes.Models, corpus: shapes.Corpus, points):
        self.cell, self.store, self.m, self.corpus = cell, store, models, corpus
        self.points: dict[int | str, Point] = points
        self.mode = "naive"
        self.calibration: Calibration | None = None
        self.index: DualIndex | None = None
        self.rng = np.random.default_rng(9)

    # -- steps -----------------------------------------------------------------

    def init(self) -> None:
        cell = self.cell
        create_pair(
            self.store,
            "p",
            old_collection="products",
            encoder=OnnxEncoder(self.m.new),
            old_encoder=OnnxEncoder(self.m.old),
            old_vector=VECTOR_NAME[cell.modality][cell.vectors] or None,
            uri=UriRule("image_url"),
            keep_old=cell.layout == "keep-old",
            layout="single-collection" if cell.layout == "single" else "paired",
            new_vector="new" if cell.layout == "single" else None,
        )
        self.index = DualIndex.open(self.store, "p", exact=True)

    def migrate(self, until: float | None) -> None:
        ray = RayOptions(encoders=2, decoders=1) if self.cell.engine == "ray" else None
        self._moved(run_migration(self.index, MigrateOptions(batch=5, until=until), ray=ray))

    def _moved(self, report: MigrationReport) -> None:
        """A run moved points, and every image or text it read was one the encoder could take."""
        assert report.moved > 0 and report.failed == 0, f"migrate: {report.failure_sample or report}"

    def calibrate(self) -> None:
        """What ``rmq calibrate --force`` keeps: the quantile map fitted on a sample."""
        pair = self.index.pair
        sample = draw_sample(self.store, pair, self.index.encoder, 100, seed=0)
        self.calibration = fit_calibration(sample.old, sample.new, metric=pair.distance)
        save_pair(self.store, replace(pair, calibration=self.calibration.as_dict()))
        self.index.refresh()

    def app_writes(self) -> None:
        """Updates (2 migrated, 2 waiting; one keeps its payload, one gets a new text vector),
        two adds (with their own text and bm25 where the collection has them), two deletes."""
        several = self.cell.vectors == "several"
        moved, waiting = self._split()
        updated = moved[:2] + waiting[:2]
        fresh, named = self.corpus.fresh, self._named
        payloads = [{**named(fresh[k]), "sku": "updated", "n": -k} for k in range(4)]
        payloads[1] = None  # the same image written again: its payload (and image_url) kept
        images = [fresh[0], self.points[updated[1]].image, fresh[2], fresh[3]]
        others = [None] * 4
        if several:
            others[2] = {"text": self.rng.normal(size=TEXT).astype(np.float32)}
        for k, point in enumerate(updated):
            p = self.points[point]
            text = others[k]["text"] if others[k] else p.text
            self.points[point] = Point(images[k], payloads[k] or p.payload, text, p.bm25)
        added = shapes.point_ids(self.cell.ids, 2, start=1000)
        for k, point in enumerate(added):
            payloads.append({**named(fresh[4 + k]), "sku": f"added-{k}", "n": 1000 + k})
            text = self.rng.normal(size=TEXT).astype(np.float32) if several else None
            bm25 = shapes.sparse(self.rng) if several and k == 0 else None
            given = {"text": text} if several else None
            if bm25 is not None:
                given["bm25"] = {"indices": bm25[0], "values": bm25[1]}
            others.append(given)
            self.points[point] = Point(fresh[4 + k], payloads[-1], text, bm25)
        images = [self.points[i].image for i in updated + added]
        self.index.upsert(updated + added, images, payloads, other_vectors=others if several else None)
        gone = [moved[2], waiting[2]]
        self.index.delete(gone)
        for point in gone:
            del self.points[point]

    def switch(self) -> None:
        switch_encoder(self.store, self.index.pair, OnnxEncoder(self.m.rm))
        self.index.close()
        self.index = DualIndex.open(self.store, "p", exact=True)  # a server restarts with the graph
        self.mode = "rm"

    def late_write(self) -> None:
        """After the switch step: one add and one update of a point still waiting, if any."""
        fresh, named = self.corpus.fresh, self._named
        point = shapes.point_ids(self.cell.ids, 1, start=1002)[0]
        writes = {point: Point(fresh[6], {**named(fresh[6]), "sku": "late", "n": 1002})}
        _, waiting = self._split()
        if waiting:
            old = self.points[waiting[0]]
            writes[waiting[0]] = Point(fresh[7], {**named(fresh[7]), "sku": "late"}, old.text, old.bm25)
        ids = list(writes)
        self.index.upsert(ids, [writes[i].image for i in ids], [writes[i].payload for i in ids])
        self.points.update(writes)

    def end(self) -> None:
        if self.cell.ending == "rollback":
            rollback(self.store, self.index.pair)
        else:
            finalize(self.store, self.index.pair, drop_old=self.cell.stated)
        self.index.refresh()
        self._check_cutover()

    def _check_cutover(self) -> None:
        """What the team's own code then reads: the alias (paired), or which vectors remain."""
        pair, store = self.index.pair, self.store
        back = pair.state == "rolled_back"
        if not pair.single:
            assert store.alias("p") == (pair.old_collection if back else pair.new_collection)
            assert store.has_collection(pair.old_collection) == (back or not pair.drop_old)
            return
        vectors = store.collection(pair.old_collection, pair.new_using).vectors
        assert pair.new_using in vectors  # a rollback keeps the new vectors, unserved
        assert (pair.vector in vectors) == (back or not pair.drop_old)

    def _named(self, item: str) -> dict:
        """The payload fields that give ``item`` to the pair."""
        return self.corpus.fields(item, self.cell.documents)

    def _split(self) -> tuple[list, list]:
        """The gallery's ids in new (migrated) and still waiting, in the team's order."""
        in_new = self._in_new(list(self.points))
        return [i for i in self.points if i in in_new], [i for i in self.points if i not in in_new]

    # -- what is stored --------------------------------------------------------

    def _in_new(self, ids: list) -> set:
        pair = self.index.pair
        found = self.store.retrieve(
            pair.new_collection, ids, with_vectors=True, vector=pair.new_using, with_payload=False
        )
        return {r.id for r in found if r.vector is not None}

    def _stored(self, collection: str, vector: str) -> dict:
        others = ("text", "bm25") if self.cell.vectors == "several" else ()
        rows = self.store.retrieve(
            collection, list(self.points), with_vectors=True, vector=vector, others=others
        )
        return {r.id: r for r in rows if r.vector is not None}

    def sides(self) -> dict:
        """Where each point serves from."""
        state = self.index.pair.state
        if state in ("finalized", "rolled_back"):
            return dict.fromkeys(self.points, "new" if state == "finalized" else "old")
        in_new = self._in_new(list(self.points))
        return {i: "new" if i in in_new else "old" for i in self.points}

    def check(self, step: str) -> None:
        pair, sides = self.index.pair, self.sides()
        done = pair.state in ("finalized", "rolled_back")
        read = {}  # side -> (collection, its points by id), for each collection that serves or may
        if pair.state != "rolled_back":
            read["new"] = (pair.new_collection, self._stored(pair.new_collection, pair.new_using))
        if pair.state != "finalized" and self.store.has_collection(pair.old_collection):
            read["old"] = (pair.old_collection, self._stored(pair.old_collection, pair.vector))
        new, old = read.get("new", ("", {}))[1], read.get("old", ("", {}))[1]
        assert set(new) == {i for i, s in sides.items() if s == "new"}, f"{step}: new holds other points"
        if pair.state == "backfilling" and (pair.keep_old or pair.single):
            assert set(old) == set(self.points), f"{step}: a point lost its old copy (no rollback for it)"
        elif pair.state != "finalized":
            assert set(old) == {i for i, s in sides.items() if s == "old"}, f"{step}: old holds other points"
        for side, (collection, stored) in read.items():
            # and nothing else: a deleted point is gone from both sides
            everything = self.points if pair.single else stored
            assert self.store.count(collection) == len(everything), f"{step}: stray points in {collection!r}"
            for point, record in stored.items():
                self._check_point(step, side, point, record, exact_payload=done)
        for query in (self.corpus.gallery[0], self.corpus.fresh[5], *self.corpus.queries):
            ranking = self.reference(query, sides)
            for limit in (K, len(self.points) + 5):
                self._check_hits(step, self.index.search(query, limit=limit), ranking, limit, sides)

    def _check_point(self, step: str, side: str, point, record, *, exact_payload: bool) -> None:
        want = self.points[point]
        role = "new" if side == "new" else "old"
        expected = self.m.vectors[role][want.image]
        got = np.asarray(record.vector, dtype=np.float64)
        if self.m.distance == "cosine":  # a cosine collection stores them normalised
            got, expected = _unit(got), _unit(expected)
        tol = 1e-4 * max(1.0, float(np.linalg.norm(expected)))
        assert np.allclose(got, expected, atol=tol), (
            f"{step}: {side} vector of {point!r} is not the {role} model's"
        )
        payload = {k: v for k, v in record.payload.items() if exact_payload or not k.startswith("rmq_")}
        assert payload == want.payload, f"{step}: {side} payload of {point!r}"
        if self.cell.vectors == "several":
            text, bm25 = record.others.get("text"), record.others.get("bm25")
            assert (text is None) == (want.text is None), f"{step}: {side} text vector of {point!r}"
            if want.text is not None:
                np.testing.assert_allclose(text, want.text, rtol=1e-6)
            assert (bm25 is None) == (want.bm25 is None), f"{step}: {side} bm25 vector of {point!r}"
            if want.bm25 is not None:
                assert list(bm25.indices) == want.bm25[0]
                np.testing.assert_allclose(list(bm25.values), want.bm25[1], rtol=1e-6)

    def reference(self, query: str, sides: dict) -> list[tuple[float, int, str, object]]:
        """The brute-force merge: (distance, new first, id) for every served point, sorted."""
        pair, vectors, queries = self.index.pair, self.m.vectors, self.m.queries
        new_q = queries["new"][query]
        naive = self.mode == "naive" or pair.state == "rolled_back"
        old_q = queries["old" if naive else "rev"][query]
        calibrated = self.calibration if (self.mode == "naive" and pair.state == "backfilling") else None
        rows = []
        for point, side in sides.items():
            image = self.points[point].image
            if side == "new":
                d = metric(new_q, vectors["new"][image], self.m.distance)
            else:
                d = metric(old_q, vectors["old"][image], self.m.distance)
                if calibrated is not None:
                    d = float(calibrated(np.array(d)))
            rows.append((d, 0 if side == "new" else 1, str(point), point))
        return sorted(rows)

    def _check_hits(self, step: str, hits, ranking, limit: int, sides) -> None:
        """The hits are a brute-force top ``limit``: the same distances in the same order (ids
        may swap only within equal distances), each from its side, with its payload."""
        where = f"{step}: top {limit}"
        top = ranking[:limit]
        ids = [h.id for h in hits]
        assert len(ids) == len(set(ids)), f"{where}: a point served twice"
        assert len(hits) == len(top), f"{where}: {len(hits)} hits for {len(top)} points"
        for hit in hits:
            assert hit.source == sides[hit.id], f"{where}: {hit.id!r} came from {hit.source}"
            assert hit.payload == self.points[hit.id].payload, f"{where}: payload of {hit.id!r}"
        distance = {row[3]: row[0] for row in ranking}
        tol = 1e-4 * max(1.0, max(abs(row[0]) for row in ranking))
        brute = [row[0] for row in top]
        got = [distance[h.id] for h in hits]
        assert np.allclose([h.distance for h in hits], got, atol=tol), f"{where}: hit distances"
        assert np.allclose(got, brute, atol=tol), (
            f"{where}: served {[(h.id, h.source, round(d, 4)) for h, d in zip(hits, got)]}, brute force "
            f"{[(row[3], 'new' if row[1] == 0 else 'old', round(row[0], 4)) for row in top]}"
        )


class TextRun(Run):
    """A text cell's upgrade: the same steps and checks, through the Python API."""

    def init(self) -> None:
        cell = self.cell
        where: dict = {"old_collection": "products"}
        if cell.layout == "single":
            where = {"collection": "products", "mode": "single-collection", "new_vector": "new"}
        rm_qdrant.init(
            self.store,
            "p",
            encoder=self.m.new,
            old_encoder=self.m.old,
            old_vector=VECTOR_NAME["text"][cell.vectors] or None,
            keep_old=cell.layout == "keep-old",
            **where,
            **TEXT_SOURCE[cell.documents],
        )
        self.index = DualIndex.open(self.store, "p", exact=True)

    def migrate(self, until: float | None) -> None:
        engine = RayOptions(encoders=2, decoders=1) if self.cell.engine == "ray" else "local"
        self._moved(rm_qdrant.migrate(self.store, "p", engine=engine, batch=5, until=until))
        self.index.refresh()

    def switch(self) -> None:
        rm_qdrant.switch_encoder(self.store, "p", self.m.rm)
        self.index.close()
        self.index = DualIndex.open(self.store, "p", exact=True)
        self.mode = "rm"

    def end(self) -> None:
        if self.cell.ending == "rollback":
            rm_qdrant.rollback(self.store, "p")
        else:
            rm_qdrant.finalize(self.store, "p", drop_old=self.cell.stated)
        self.index.refresh()
        self._check_cutover()


@pytest.fixture(params=CELLS, ids=[cell.id for cell in CELLS])
def cell(request) -> Cell:
    return request.param


@pytest.mark.slow
def test_every_step_serves_each_point_once_with_its_own_vectors_ranked_as_brute_force(
    cell, corpora, model_sets, tmp_path: Path, request
):
    if cell.engine == "ray":
        request.getfixturevalue("local_ray")
    corpus = corpora[cell.modality]
    models = model_sets(cell.modality, cell.distance, cell.scale, cell.stated)
    points = shapes.team_points(corpus, cell.ids, cell.vectors, cell.documents)
    folder = tmp_path / "team"
    shapes.build_collection(
        folder,
        cell.backend,
        distance=cell.distance,
        vectors=cell.vectors,
        points=points,
        old=models.vectors["old"],
        modality=cell.modality,
    )
    with open_store(folder, create=False) as store:
        run = (TextRun if cell.modality == "text" else Run)(cell, store, models, corpus, points)
        run.init()
        run.check("init")
        run.migrate(0.5)
        run.check("migrate 0.5")
        if cell.scale == "raw":
            run.calibrate()
            run.check("calibrate")
        run.app_writes()
        run.check("application writes")
        if cell.switch:
            run.switch()
            run.check("switch to the rm graph")
        run.late_write()
        run.check("late write")
        if cell.ending == "finalize":
            run.migrate(None)
            run.check("migrate all")
        run.end()
        run.check(cell.ending)
        run.index.close()


def test_the_design_puts_every_pair_of_axis_values_in_some_cell():
    """Whatever two axes a bug needs (say a dot collection with UUID ids), some cell has them."""
    missing = shapes.required_pairs() - set().union(*(shapes.covered(c) for c in design()))
    assert not missing
    crossed = {"image": ("distance", "scale", "layout"), "text": ("distance", "layout")}
    for modality, axes in crossed.items():
        cells = [c for c in CELLS if c.modality == modality]
        assert {tuple(getattr(c, n) for n in axes) for c in cells} == set(
            itertools.product(*(shapes.AXES[n] for n in axes))
        ), modality
