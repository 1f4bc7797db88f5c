"""``rmq fit`` on a text pair: documents in a payload field, a team's text backbone, no labels or labels.

The pair: an old collection of documents embedded by one small text model (seed 1), the team's
new text model (seed 2) as the backbone, every document's text in the payload field ``body``
and its topic in ``topic``. The fitted graph must be a text graph rm-qdrant loads, a running
pair must take it (``rmq switch-encoder``), and its queries must find the old half's documents
of their topic, which the new model's own vectors cannot (two unrelated spaces).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import rm_qdrant
from rm_qdrant import DualIndex, TextEncoder, load_encoder, open_store
from rm_qdrant.cli import cli
from tests.text_fit_data import mixed_texts, topic_sentences
from tests.text_models import stamped_text_graph

pytestmark = pytest.mark.slow

pytest.importorskip("torch")

N = 320
EMPTY = 7


def make_pair(folder: Path, docs: list[str], topics: list[str], old: Path, encoder: Path, **init) -> None:
    """The team's collection 'docs' (the old model's vectors, text and topic in the payload) and
    a pair 'upgrade' on it whose documents are read from ``body``."""
    readable = [d if d.strip() else "the" for d in docs]  # the old model once read something there
    vectors = load_encoder(old).encode(readable, ["embedding"])["embedding"]
    with open_store(folder) as store:
        store.create_collection("docs", dim=vectors.shape[1], distance="cosine")
        payloads = [{"body": d, "topic": t} for d, t in zip(docs, topics)]
        store.upsert("docs", list(range(len(docs))), vectors, payloads)
        rm_qdrant.init(store, "upgrade", encoder=encoder, old_collection="docs", text_field="body", **init)


def runner(folder: Path):
    def rmq(*args: object, ok: bool = True):
        result = CliRunner().invoke(cli, ["--qdrant", str(folder), *map(str, args)])
        assert (result.exit_code == 0) == ok, result.output
        return result

    return rmq


def precision(hits: list[list], wanted: list[str], topics: list[str]) -> float:
    """The share of each query's hits whose topic is the query's, over all queries."""
    return float(np.mean([[topics[h.id] == want for h in row] for row, want in zip(hits, wanted)]))


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("text-models")
    return stamped_text_graph(folder, "old", seed=1), stamped_text_graph(folder, "new", seed=2)


@pytest.fixture
def team(tmp_path: Path, graphs: tuple[Path, Path]):
    old, new = graphs
    docs, topics = mixed_texts(N, seed=0)
    docs[EMPTY] = " "  # a document with no text: skipped and counted, as an unreadable image is
    make_pair(tmp_path / "store", docs, topics, old, new, old_encoder=old)
    return runner(tmp_path / "store"), tmp_path, docs, topics


def fit_args(backbone: Path, out: Path) -> list[object]:
    return [
        "fit",
        "--name",
        "upgrade",
        "--backbone",
        backbone,
        "--out",
        out,
        "--sample",
        N,
        "--holdout",
        "0.2",
    ]


def test_a_label_free_fit_on_a_text_pair_is_served_by_switch_encoder(team, graphs):
    rmq, tmp, _, topics = team
    _, new = graphs
    out = tmp / "fitted.onnx"
    report = json.loads(rmq(*fit_args(new, out), "--json").output)
    assert (report["loss"], report["decided_by"], report["better_than_naive"]) == (
        "label-free",
        "guard",
        True,
    )
    assert (report["sample"], report["unreadable"]) == (N - 1, 1)
    assert report["parity"] < 1e-4 and not report["learned_rho"]
    fitted = load_encoder(out)
    assert isinstance(fitted, TextEncoder) and dict(fitted.info.outputs) == {"new": 16, "rev": 16}
    assert fitted.spec.tokenizer_sha256 == TextEncoder(new).spec.tokenizer_sha256

    rmq("migrate", "--name", "upgrade", "--until", "0.5")
    rmq("switch-encoder", "--name", "upgrade", "--encoder", out)
    assert json.loads(rmq("status", "--name", "upgrade", "--json").output)["mode"] == "rm"
    queries, wanted = mixed_texts(80, seed=1)
    plain = load_encoder(new).encode(queries, ["embedding"], query=True)["embedding"]
    rev = fitted.encode(queries, ["rev"], query=True)["rev"]
    with open_store(tmp / "store") as store:
        served = precision(DualIndex.open(store, "upgrade").search_batch(queries, limit=10), wanted, topics)
        # the half still in old: ψ's queries against RM_naive-style cross-space ones (the new
        # model's own vectors against the old model's)
        old_half = precision(store.search("docs", rev, limit=10), wanted, topics)
        cross = precision(store.search("docs", plain, limit=10), wanted, topics)
    assert old_half > cross + 0.2 and served >= 0.9, (served, old_half, cross)


def test_a_labelled_fit_on_a_text_pair_serves_above_the_naive_merge(team, graphs, tmp_path):
    rmq, tmp, docs, topics = team
    old, new = graphs
    out = tmp / "mcl.onnx"
    report = json.loads(rmq(*fit_args(new, out), "--label-field", "topic", "--steps", "300", "--json").output)
    assert (report["loss"], report["decided_by"], report["labels_from"]) == ("mcl", "labels", "topic")
    assert report["better_than_naive"] and report["learned_rho"] and report["parity"] < 1e-4
    assert isinstance(load_encoder(out), TextEncoder)

    # ρ was learned: the graph serves a pair of its own, beside the naive pair, both half migrated
    make_pair(tmp_path / "fitted-store", docs, topics, old, out)
    fitted_rmq = runner(tmp_path / "fitted-store")
    served = {}
    queries, wanted = mixed_texts(80, seed=1)
    for name, run, folder in (
        ("naive", rmq, tmp / "store"),
        ("fitted", fitted_rmq, tmp_path / "fitted-store"),
    ):
        run("migrate", "--name", "upgrade", "--until", "0.5")
        with open_store(folder) as store:
            served[name] = precision(
                DualIndex.open(store, "upgrade").search_batch(queries, limit=10), wanted, topics
            )
    assert served["fitted"] > served["naive"], served


def test_an_image_backbone_for_a_text_pair_is_one_error_line(team, models):
    rmq, tmp, _, _ = team
    result = rmq(*fit_args(models.new_only, tmp / "x.onnx"), ok=False)
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "reads images; pair 'upgrade' holds text" in errors[0], result.output
    assert result.exit_code == 1 and "Traceback" not in result.output and not (tmp / "x.onnx").exists()


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The real pretrained pair of the text demo (rm_qdrant.evaluation.text_corpus):
    paraphrase-MiniLM-L3-v2 (old, its own mean-pooled output) and all-MiniLM-L6-v2 int8 (new,
    token states that the fit pools inside the graph), with the bundled tokenizer."""
    from rm_qdrant.errors import ConfigError
    from rm_qdrant.evaluation.text_corpus import stamp_demo_models

    try:
        return stamp_demo_models(tmp_path_factory.mktemp("minilm"))
    except ConfigError as exc:
        pytest.skip(str(exc))


def test_the_real_minilm_pair_fits_with_labels_and_padding_never_reaches_a_vector(minilm, tmp_path):
    old, new = minilm
    docs, topics = topic_sentences(300, seed=0)
    make_pair(tmp_path / "store", docs, topics, old, new, old_encoder=old, label_field="topic")
    rmq = runner(tmp_path / "store")
    out = tmp_path / "fitted.onnx"
    args = ["--sample", "300", "--holdout", "0.2", "--label-field", "topic", "--steps", "300", "--json"]
    report = json.loads(rmq("fit", "--name", "upgrade", "--backbone", new, "--out", out, *args).output)
    assert (report["loss"], report["decided_by"], report["better_than_naive"]) == ("mcl", "labels", True)
    assert report["parity"] < 1e-4
    fitted = load_encoder(out)
    assert isinstance(fitted, TextEncoder) and (fitted.spec.max_length, fitted.spec.pooling) == (
        256,
        "output",
    )

    # one sentence alone, or in a batch padded to a sentence six times its length: the same vectors
    queries, wanted = topic_sentences(60, seed=1)
    batch = ["Rain.", " ".join(queries[:6]), *queries[6:11]]
    together = fitted.encode(batch, ["new", "rev"])
    for row, text in enumerate(batch):
        alone = fitted.encode([text], ["new", "rev"])
        for role in ("new", "rev"):
            np.testing.assert_allclose(alone[role][0], together[role][row], atol=1e-5)

    make_pair(tmp_path / "fitted-store", docs, topics, old, out)
    served = {}
    for name, folder in (("naive", tmp_path / "store"), ("fitted", tmp_path / "fitted-store")):
        runner(folder)("migrate", "--name", "upgrade", "--until", "0.5")
        with open_store(folder) as store:
            served[name] = precision(
                DualIndex.open(store, "upgrade").search_batch(queries, limit=10), wanted, topics
            )
    assert served["fitted"] > served["naive"], served


def test_a_text_backbone_for_an_image_pair_is_one_error_line(rmq, demo, graphs, tmp_path):
    _, new = graphs
    result = rmq("fit", "--name", "demo", "--backbone", new, "--out", tmp_path / "x.onnx", ok=False)
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "reads text; pair 'demo''s model" in errors[0] and "reads images" in errors[0]
    assert result.exit_code == 1 and not (tmp_path / "x.onnx").exists()


def test_a_fit_reads_a_text_pairs_documents_from_their_uris(graphs, tmp_path):
    """Documents as files behind a payload URI (not in the payload): fetched and read as UTF-8."""
    old, new = graphs
    docs, topics = mixed_texts(N, seed=0)
    files = tmp_path / "docs"
    files.mkdir()
    for i, doc in enumerate(docs):
        (files / f"{i:04d}.txt").write_text(doc, encoding="utf-8")
    (files / f"{EMPTY:04d}.txt").write_bytes(b"\xff\xd8\xff\xe0 a JPEG, not text")
    vectors = load_encoder(old).encode(docs, ["embedding"])["embedding"]
    with open_store(tmp_path / "store") as store:
        store.create_collection("docs", dim=16, distance="cosine")
        store.upsert("docs", list(range(N)), vectors, [{"path": f"{i:04d}.txt"} for i in range(N)])
        rm_qdrant.init(
            store, "upgrade", encoder=new, old_collection="docs", old_encoder=old, uri_field="path"
        )
    rmq = runner(tmp_path / "store")
    out = tmp_path / "fitted.onnx"
    args = ["--root", files, "--loss", "procrustes", "--force", "--json"]
    report = json.loads(rmq(*fit_args(new, out), *args).output)
    assert (report["sample"], report["unreadable"], report["recipe"]) == (N - 1, 1, "procrustes")
    fitted = load_encoder(out)
    assert isinstance(fitted, TextEncoder)
    # ψ learnt from the files: queries find old documents of their topic, as the plain new
    # model's vectors do not
    queries, wanted = mixed_texts(80, seed=1)
    rev = fitted.encode(queries, ["rev"], query=True)["rev"]
    plain = load_encoder(new).encode(queries, ["embedding"], query=True)["embedding"]
    with open_store(tmp_path / "store") as store:
        by_psi = precision(store.search("docs", rev, limit=10), wanted, topics)
        cross = precision(store.search("docs", plain, limit=10), wanted, topics)
    assert by_psi > cross + 0.2, (by_psi, cross)
