"""Deployment shapes for the shapes matrix (tests/e2e/test_shapes_matrix.py): which cells
run (:func:`design`), real ONNX graphs for each metric and scale (image graphs, and text graphs
with a WordPiece tokenizer stamped in), real PNG files or texts (in a payload field, a nested
one, or UTF-8 files), and a team's collection made with plain qdrant-edge or qdrant-client calls
in each vector layout, with integer or UUID ids.

Nothing here imports rm-qdrant's backfill code: this is what the team has before rm-qdrant
runs. The expected vectors are the graphs' outputs as ONNX Runtime gives them.
"""

from __future__ import annotations

import itertools
import os
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import qdrant_edge as qe
from onnx import TensorProto, helper, numpy_helper
from PIL import Image
from qdrant_client import QdrantClient
from qdrant_client import models as qm

from rm_qdrant import OnnxEncoder
from rm_qdrant.core.modelinfo import ModelInfo
from tests.conftest import NEW_DIM, OLD_DIM, PIXELS, SPEC
from tests.text_models import (
    DOCUMENT_PREFIX,
    QUERY_PREFIX,
    TextModelSet,
    reference_vectors,
    text_model_set,
    varied_texts,
)

GALLERY = 24  # points the team indexed
FRESH = 8  # images the application writes during the backfill
QUERIES = 2  # images in neither
TEXT = 3  # the team's own dense vector 'text' (dot)
#: A raw new model's vectors are this much longer than the old model's.
RAW_STRETCH = 3.0


#: Every axis and its values. ``backend``, ``switch`` (switch-encoder to the rm graph after the
#: application's writes), ``ending`` and ``stated`` (the new graphs stamped with the distance,
#: else for any distance; a finalize with ``stated`` also drops old) and ``engine`` (the
#: migration's: threads, or ``--engine ray``) are the smaller axes. ``modality``: what the
#: gallery is, images or texts; ``documents``: where a point's image or text is: a file its
#: payload names (every image), or the text itself in a payload field (``body``) or a nested
#: one (``doc.body``).
AXES: dict[str, tuple] = {
    "modality": ("image", "text"),
    "documents": ("files", "field", "nested"),
    "distance": ("cosine", "dot", "euclid"),
    "scale": ("unit", "raw"),
    "vectors": ("unnamed", "named", "several"),
    "layout": ("paired", "keep-old", "single"),
    "ids": ("int", "uuid"),
    "backend": ("edge", "local"),
    "switch": (False, True),
    "ending": ("finalize", "rollback"),
    "stated": (False, True),
    "engine": ("local", "ray"),
}
#: The default suite runs every distance x scale x layout of images and every distance x layout
#: of texts, the other axes chosen so that every pair of values of any two axes appears in some
#: cell. RMQ_SHAPES=full runs every distance x scale x vectors x layout x ids of each modality
#: (216 cells), the smaller axes chosen the same way.
FULL = os.environ.get("RMQ_SHAPES") == "full"
_EVERY = ("distance", "scale", "vectors", "layout", "ids")
CROSSED: dict[str, tuple[str, ...]] = {
    "image": _EVERY if FULL else ("distance", "scale", "layout"),
    "text": _EVERY if FULL else ("distance", "layout"),
}


def allowed(values: dict) -> bool:
    """Only a keep-old or single-collection pair can roll back; an image is in a file."""
    if values.get("modality") == "image" and values.get("documents", "files") != "files":
        return False
    return not (values.get("layout") == "paired" and values.get("ending") == "rollback")


#: The axes whose every value meets each engine in some cell: what a batch's images become
#: (the distance's unusable vectors), how it is claimed and settled (the layout, the other
#: vectors carried), the ids sent through Ray, and what the workers decode (images or texts, read
#: from files or from the payload sent along). The store, scales and the steps after a
#: migration are the driver's, whichever engine embedded the images.
ENGINE_MEETS = ("distance", "layout", "vectors", "ids", "modality", "documents")


def required_pairs() -> set[tuple[tuple[str, object], tuple[str, object]]]:
    pairs = set()
    for (a, xs), (b, ys) in itertools.combinations(AXES.items(), 2):
        if "engine" in (a, b) and not {a, b} & set(ENGINE_MEETS):
            continue
        pairs |= {((a, x), (b, y)) for x in xs for y in ys if allowed({a: x, b: y})}
    return pairs


def covered(cell: dict) -> set:
    return set(itertools.combinations(cell.items(), 2))


def design() -> list[dict]:
    """Each modality's crossed axes in full (by default the vector layout too, as a Latin square
    over distance x layout, and a text's documents as a second one, orthogonal to it); each
    cell's other axes picked greedily to cover the most pairs of values not yet covered, the
    least used values first: the same design on every run."""
    todo, cells = required_pairs(), []
    used: dict[tuple[str, object], int] = {}
    for modality in AXES["modality"]:
        crossed = CROSSED[modality]
        squared = () if FULL else ("vectors", "documents") if modality == "text" else ("vectors",)
        free = [name for name in AXES if name not in (*crossed, *squared, "modality")]
        choices = [dict(zip(free, values)) for values in itertools.product(*(AXES[n] for n in free))]
        for values in itertools.product(*(AXES[n] for n in crossed)):
            fixed = {"modality": modality, **dict(zip(crossed, values)), **_squares(values, crossed, squared)}
            options = [{**fixed, **c} for c in choices if allowed({**fixed, **c})]

            # ties go to the local engine (a Ray cell costs its workers' start-up), then to the least used
            gains = [
                (len(covered(c) & todo), c["engine"] == "local", -sum(used.get((n, c[n]), 0) for n in free))
                for c in options
            ]
            best = options[gains.index(max(gains))]
            cells.append({name: best[name] for name in AXES})
            todo -= covered(best)
            for name in free:
                used[(name, best[name])] = used.get((name, best[name]), 0) + 1
    return cells


def _squares(values: tuple, crossed: tuple[str, ...], squared: tuple[str, ...]) -> dict[str, object]:
    """The Latin squares' values for a cell: vectors at (distance + layout) mod 3, documents at
    (distance + 2 layout) mod 3 (every pair of the four axes' values then meets)."""
    if not squared:
        return {}
    at = dict(zip(crossed, values))
    d, layout = AXES["distance"].index(at["distance"]), AXES["layout"].index(at["layout"])
    shift = {"vectors": 1, "documents": 2}
    return {name: AXES[name][(d + shift[name] * layout) % 3] for name in squared}


@dataclass(frozen=True)
class Cell:
    distance: str
    scale: str
    vectors: str
    layout: str
    ids: str
    backend: str  # 'edge' (a qdrant-edge shard) or 'local' (QdrantClient(path=...))
    switch: bool
    ending: str
    stated: bool
    engine: str  # 'local' (threads) or 'ray' (rmq migrate --engine ray on a local Ray)
    modality: str  # 'image' or 'text'
    documents: str  # 'files' (every image), or a text in the payload: 'field' ('body'), 'nested' ('doc.body')

    @property
    def id(self) -> str:
        tail = [
            "switch" if self.switch else "naive",
            self.ending,
            "stated" if self.stated else "any",
            self.engine,
        ]
        head = [] if self.modality == "image" else [self.modality, self.documents]
        return "-".join(
            [*head, self.distance, self.scale, self.vectors, self.layout, self.ids, self.backend, *tail]
        )


def write_images(folder: Path, count: int, seed: int) -> list[str]:
    """``count`` distinct 8x8 PNG files of uniform noise; their absolute paths."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    uris = []
    for k in range(count):
        target = folder / f"{k:03d}.png"
        Image.fromarray(rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)).save(target)
        uris.append(str(target.resolve()))
    return uris


@dataclass(frozen=True)
class Corpus:
    """What a gallery holds, what the application writes during the backfill and what is asked:
    image paths, or texts (each also in a UTF-8 file, ``files``, for the cells that keep texts
    in files). A text is asked as it is; an image by its path."""

    modality: str
    gallery: list[str]
    fresh: list[str]
    queries: list[str]
    files: dict[str, str] = field(default_factory=dict)  # text -> the absolute path of its file

    @property
    def every(self) -> list[str]:
        return self.gallery + self.fresh + self.queries

    def fields(self, item: str, documents: str) -> dict[str, Any]:
        """The payload fields that give ``item`` to a pair, where ``documents`` says it is."""
        if self.modality == "image":
            return {"image_url": item}
        if documents == "files":
            return {"doc_url": self.files[item]}
        if documents == "field":
            return {"body": item}
        return {"doc": {"body": item, "lang": "en"}}


#: How a text pair reads its documents (``rm_qdrant.init``'s keywords), for each ``documents``.
TEXT_SOURCE = {
    "files": {"uri_field": "doc_url"},
    "field": {"text_field": "body"},
    "nested": {"text_field": "doc.body"},
}


def make_images(root: Path) -> Corpus:
    return Corpus(
        "image",
        write_images(root / "gallery", GALLERY, 1),
        write_images(root / "fresh", FRESH, 2),
        write_images(root / "queries", QUERIES, 3),
    )


def make_texts(root: Path) -> Corpus:
    """Distinct documents on four topics (tests/text_models.py) of 2 to 14 words, each also in a
    UTF-8 file, and two short queries in none. Some have accented letters (the tokenizer strips
    the accents: the same words) and one an emoji: text that is UTF-8 through files and payloads."""
    docs = [
        doc.replace("e", "é", 1) + (" ☔" if k == 7 else "") if k % 5 == 2 else doc
        for k, doc in enumerate(varied_texts(GALLERY + FRESH, seed=4))
    ]
    root.mkdir(parents=True, exist_ok=True)
    files = {}
    for k, doc in enumerate(docs):
        target = root / f"{k:03d}.txt"
        target.write_text(doc, encoding="utf-8")
        files[doc] = str(target.resolve())
    queries = ["puppy and kitten", "a storm with thunder and rain"]
    return Corpus("text", docs[:GALLERY], docs[GALLERY:], queries, files)


def _graph(path: Path, projections: list[tuple[str, str, np.ndarray]], *, name: str, **stamp: Any) -> Path:
    """A linear graph (uint8 pixels / 255, then matrix products); ``scale='unit'`` L2-normalises
    each output right where it is made, so a later projection reads the normalised one."""
    nodes = [
        helper.make_node("Cast", ["images"], ["as_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["as_float", "inv255"], ["scaled"]),
        helper.make_node("Flatten", ["scaled"], ["pixels"], axis=1),
    ]
    inits = [numpy_helper.from_array(np.array(1.0 / 255.0, dtype=np.float32), "inv255")]
    outputs, dims = [], {}
    for out, source, matrix in projections:
        weight = np.asarray(matrix, dtype=np.float32)
        inits.append(numpy_helper.from_array(weight, f"W_{out}"))
        unit = stamp.get("scale") == "unit"
        nodes.append(helper.make_node("MatMul", [source, f"W_{out}"], [f"{out}_raw" if unit else out]))
        if unit:
            nodes.append(helper.make_node("LpNormalization", [f"{out}_raw"], [out], axis=1, p=2))
        outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", weight.shape[1]]))
        dims[out] = int(weight.shape[1])
    images = helper.make_tensor_value_info("images", TensorProto.UINT8, ["N", SPEC.height, SPEC.width, 3])
    graph = helper.make_graph(nodes, name, [images], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, ModelInfo(name=name, outputs=dims, input=SPEC, **stamp).to_metadata())
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@dataclass(frozen=True)
class Models:
    """The team's old model, its plain new model (naive), and an rm graph whose ``new`` is the
    plain new model's output and whose ``rev`` = ψ(new) is (images) exactly the old model's output."""

    old: Path
    new: Path
    rm: Path
    distance: str
    vectors: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # role -> item -> vector
    queries: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # the same, asked as a query
    text: TextModelSet | None = None  # a text set: how its graphs were stamped


def make_models(root: Path, distance: str, scale: str, *, stated: bool) -> Models:
    """Graphs for ``distance`` and ``scale``; the new ones are stamped with the distance when
    ``stated``, else for any distance. Each weight column sums to zero over the pixels, so an
    image's vector is its noise pattern (directions spread out)."""
    rng = np.random.default_rng(AXES["distance"].index(distance) * 2 + (scale == "raw"))

    def weights(dim: int) -> np.ndarray:
        w = rng.normal(size=(PIXELS, dim))
        return w - w.mean(axis=0)

    w_old = weights(OLD_DIM)
    stretch = RAW_STRETCH if scale == "raw" else 1.0
    w_new = stretch * np.hstack([w_old, weights(NEW_DIM - OLD_DIM)])
    psi = np.vstack([np.eye(OLD_DIM) / stretch, np.zeros((NEW_DIM - OLD_DIM, OLD_DIM))])
    root.mkdir(parents=True, exist_ok=True)
    new_stamp = {"distance": distance if stated else None, "scale": scale}
    return Models(
        old=_graph(
            root / "old.onnx", [("embedding", "pixels", w_old)], name="old", distance=distance, scale=scale
        ),
        new=_graph(root / "new.onnx", [("embedding", "pixels", w_new)], name="new", **new_stamp),
        rm=_graph(root / "rm.onnx", [("new", "pixels", w_new), ("rev", "new", psi)], name="rm", **new_stamp),
        distance=distance,
    )


def make_text_models(root: Path, distance: str, scale: str, *, stated: bool) -> Models:
    """Text graphs (tests/text_models.py's, stamped with its vocabulary) for ``distance`` and
    ``scale``: an old and a new model of other seeds (two incompatible spaces), the new one's
    vectors ``RAW_STRETCH`` times longer at raw scale (L2-normalised at unit scale), and an rm
    graph whose ``rev`` is a fixed projection of ``new``. Each (distance, scale) pools its own way
    (mean, cls or the graph's one vector a text). Queries get a prefix, the new model's documents
    another: a query encoded as a document is another vector."""
    k = AXES["distance"].index(distance) * 2 + (scale == "raw")
    stretch = RAW_STRETCH if scale == "raw" else 1.0
    made = text_model_set(
        root,
        dims=(OLD_DIM, NEW_DIM),
        seeds=(10 + k, 20 + k),
        pooling=("mean", "cls", "output")[k % 3],
        rev=np.random.default_rng(k).normal(size=(NEW_DIM, OLD_DIM)) / (np.sqrt(NEW_DIM) * stretch),
        stretch=stretch,
        scale=scale,
        distance=distance,
        new_distance=distance if stated else None,
    )
    return Models(made.old, made.new, made.rm, distance, text=made)


def embed(models: Models, items: list[str]) -> Models:
    """``models`` with every graph's output for ``items`` (as documents, and as queries), as ONNX
    Runtime gives it: an image through rm-qdrant's encoder (uint8 pixels in, vectors out), a text
    without rm-qdrant (:func:`~tests.text_models.reference_vectors`)."""
    tables = []
    for query in (False, True):
        out = {}
        for name in ("old", "new", "rm"):
            graph = getattr(models, name)
            if models.text is None:
                out[name] = OnnxEncoder(graph).encode(items)
            else:
                prefix = QUERY_PREFIX if query else DOCUMENT_PREFIX[name]
                out[name] = reference_vectors(graph, models.text, items, prefix=prefix)
        old, new, rm = out["old"]["embedding"], out["new"]["embedding"], out["rm"]
        table = {"old": old, "new": new, "rm_new": rm["new"], "rev": rm["rev"]}
        tables.append({role: dict(zip(items, rows)) for role, rows in table.items()})
    return replace(models, vectors=tables[0], queries=tables[1])


def point_ids(kind: str, count: int, start: int = 0) -> list[int | str]:
    if kind == "int":
        return list(range(start, start + count))
    return [str(uuid.uuid5(uuid.NAMESPACE_URL, f"shape-{k}")) for k in range(start, start + count)]


def sparse(rng: np.random.Generator) -> tuple[list[int], list[float]]:
    indices = sorted(rng.choice(1000, size=3, replace=False).tolist())
    return indices, rng.uniform(0.1, 2.0, size=3).astype(np.float32).tolist()


@dataclass
class Point:
    """What the team expects a point to be: its image (or text), payload and the vectors
    rm-qdrant must not touch (None: the point has none)."""

    image: str
    payload: dict[str, Any]
    text: np.ndarray | None = None
    bm25: tuple[list[int], list[float]] | None = None


#: The searched vector's name in each vector layout ('' is the unnamed vector), by modality.
VECTOR_NAME = {
    "image": {"unnamed": "", "named": "image", "several": "image"},
    "text": {"unnamed": "", "named": "dense", "several": "dense"},
}


def team_points(corpus: Corpus, kind: str, vectors: str, documents: str = "files") -> dict[int | str, Point]:
    rng = np.random.default_rng(5)
    points = {}
    for k, (point, item) in enumerate(zip(point_ids(kind, GALLERY), corpus.gallery)):
        payload = {**corpus.fields(item, documents), "sku": f"SKU-{k}", "n": k}
        if vectors == "several":
            points[point] = Point(item, payload, rng.normal(size=TEXT).astype(np.float32), sparse(rng))
        else:
            points[point] = Point(item, payload)
    return points


def build_collection(
    folder: Path, backend: str, *, distance: str, vectors: str, points, old, modality: str = "image"
) -> None:
    """The team's 'products' collection, written with plain qdrant-edge (a shard in an embedded
    store) or qdrant-client (a ``QdrantClient(path=...)`` folder) calls; ``old``: item -> vector."""
    name = VECTOR_NAME[modality][vectors]
    if backend == "edge":
        _edge(folder, distance, name, vectors == "several", points, old)
    else:
        _client(folder, distance, name, vectors == "several", points, old)


def _edge(folder: Path, distance: str, name: str, several: bool, points, old) -> None:
    metric = {"cosine": qe.Distance.Cosine, "dot": qe.Distance.Dot, "euclid": qe.Distance.Euclid}[distance]
    params = qe.EdgeVectorParams(size=OLD_DIM, distance=metric)
    if not name:
        config = qe.EdgeConfig(vectors=params)
    elif not several:
        config = qe.EdgeConfig(vectors={name: params})
    else:
        text = qe.EdgeVectorParams(size=TEXT, distance=qe.Distance.Dot)
        bm25 = qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)
        config = qe.EdgeConfig(vectors={name: params, "text": text}, sparse_vectors={"bm25": bm25})
    path = folder / "collections" / "products" / "shard"
    path.parent.mkdir(parents=True)
    shard = qe.EdgeShard.create(str(path), config)
    rows = []
    for point, p in points.items():
        vector: Any = old[p.image].tolist()
        if name:
            vector = {name: vector}
        if several:
            vector.update(text=p.text.tolist(), bm25=qe.SparseVector(*p.bm25))
        rows.append(qe.Point(point, vector, p.payload))
    shard.update(qe.UpdateOperation.upsert_points(rows))
    shard.close()


def _client(folder: Path, distance: str, name: str, several: bool, points, old) -> None:
    metric = {"cosine": qm.Distance.COSINE, "dot": qm.Distance.DOT, "euclid": qm.Distance.EUCLID}[distance]
    params = qm.VectorParams(size=OLD_DIM, distance=metric)
    client = QdrantClient(path=str(folder))
    config: Any = params if not name else {name: params}
    sparse_config = None
    if several:
        config["text"] = qm.VectorParams(size=TEXT, distance=qm.Distance.DOT)
        sparse_config = {"bm25": qm.SparseVectorParams(modifier=qm.Modifier.IDF)}
    client.create_collection("products", vectors_config=config, sparse_vectors_config=sparse_config)
    rows = []
    for point, p in points.items():
        vector: Any = old[p.image].tolist()
        if name:
            vector = {name: vector}
        if several:
            indices, values = p.bm25
            vector.update(text=p.text.tolist(), bm25=qm.SparseVector(indices=indices, values=values))
        rows.append(qm.PointStruct(id=point, vector=vector, payload=p.payload))
    client.upsert("products", rows)
    client.close()
