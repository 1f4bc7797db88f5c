"""How text is prepared for a graph: the ``input`` object of a text encoder's metadata (pure: no I/O).

A text encoder's ``input`` object says ``"modality": "text"`` and pins everything that,
changed, would serve a different space without a word::

    {"modality": "text", "max_length": 256, "truncation": "right", "pooling": "mean",
     "normalize": true, "query_prefix": "", "document_prefix": "",
     "token_type_ids": true, "tokenizer_sha256": "be50c3628f2bf5bb"}

The tokenizer itself (a Hugging Face ``tokenizers`` JSON document) travels in the same
graph, in a metadata entry of its own (:data:`TOKENIZER_KEY`): a graph is one file, and a
different tokenizer is a different graph fingerprint. ``tokenizer_sha256`` names it for
people and is checked against the entry.

- ``max_length``: tokens per text, special tokens included; a longer text is cut as the
  tokenizer's own truncation cuts it (``truncation``: keep the start, ``right``, or the
  end, ``left``).
- ``pooling``: ``mean`` (the token states averaged over the attention mask), ``cls`` (the
  first token's state) or ``output`` (the graph's output is already one vector a text).
- ``normalize``: the pooled vectors are L2-normalised.
- ``query_prefix`` / ``document_prefix``: put before a query's / a document's text, as
  asymmetric models need (e5: ``"query: "`` / ``"passage: "``); empty for symmetric ones.
- ``token_type_ids``: the graph takes BERT's third input (fed zeros: one segment).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from rm_qdrant.core.inputspec import choice, int_in, show
from rm_qdrant.errors import EncoderError

#: The metadata entry that holds a text graph's tokenizer (``tokenizers`` JSON).
TOKENIZER_KEY = "rm_qdrant_tokenizer"
POOLINGS = ("mean", "cls", "output")
TRUNCATIONS = ("right", "left")
#: The longest ``max_length`` a graph may declare, in tokens.
MAX_TOKENS = 8192
#: The longest prefix, in characters.
MAX_PREFIX = 200
#: The largest tokenizer entry read, in characters (a large multilingual vocabulary is ~17 MB).
MAX_TOKENIZER_CHARS = 32 << 20
#: The graph's inputs, by the names common exporters give them.
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def tokenizer_sha(text: str) -> str:
    """The first 16 hex digits of the SHA-256 of a tokenizer entry."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class TextSpec:
    """How texts are tokenised, fed and pooled (see the module's docstring)."""

    max_length: int
    pooling: str = "mean"
    normalize: bool = True
    truncation: str = "right"
    query_prefix: str = ""
    document_prefix: str = ""
    token_type_ids: bool = False
    tokenizer_sha256: str = ""
    #: The tokenizer's JSON document (from :data:`TOKENIZER_KEY`): not part of ``input``.
    tokenizer: str = field(default="", compare=False, repr=False)

    modality = "text"

    def describe(self) -> str:
        """One line for people, e.g. ``text, 256 tokens (cut right), mean pooling, L2-normalised``."""
        text = f"text, {self.max_length} tokens (cut {self.truncation}), {self.pooling} pooling"
        text += ", L2-normalised" if self.normalize else ""
        if self.query_prefix or self.document_prefix:
            text += f", prefixes {self.query_prefix!r} / {self.document_prefix!r}"
        return text + f", tokenizer {self.tokenizer_sha256}"

    def prefix(self, *, query: bool) -> str:
        return self.query_prefix if query else self.document_prefix

    def to_json(self) -> dict[str, Any]:
        return {
            "modality": "text",
            "max_length": self.max_length,
            "truncation": self.truncation,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "query_prefix": self.query_prefix,
            "document_prefix": self.document_prefix,
            "token_type_ids": self.token_type_ids,
            "tokenizer_sha256": self.tokenizer_sha256,
        }


def is_text_input(raw: Any) -> bool:
    """Whether a metadata ``input`` object describes a text graph."""
    return isinstance(raw, dict) and raw.get("modality") == "text"


def parse_text_input(raw: dict[str, Any], tokenizer: str | None) -> TextSpec:
    """Read and check a text graph's ``input`` object, with its tokenizer entry.

    Raises:
        EncoderError: a missing, mistyped or contradictory fact, or a tokenizer entry
            that is missing, too large, or not the one ``tokenizer_sha256`` names (one line).
    """
    if tokenizer is None:
        raise EncoderError(
            f"a text graph needs its tokenizer in the '{TOKENIZER_KEY}' metadata entry; "
            "stamp it with 'rmq model stamp --tokenizer PATH'"
        )
    if len(tokenizer) > MAX_TOKENIZER_CHARS:
        raise EncoderError(f"'{TOKENIZER_KEY}' is {len(tokenizer):,} characters, over 32 MiB")
    sha = raw.get("tokenizer_sha256")
    if sha != tokenizer_sha(tokenizer):
        raise EncoderError(
            f"input.tokenizer_sha256 is {show(sha)} but the '{TOKENIZER_KEY}' entry hashes to "
            f"{tokenizer_sha(tokenizer)}: the tokenizer was changed after the graph was stamped"
        )
    spec = TextSpec(
        max_length=int_in(raw.get("max_length"), "input.max_length", MAX_TOKENS),
        pooling=choice(raw.get("pooling", "mean"), "input.pooling", POOLINGS),
        normalize=_flag(raw.get("normalize", True), "input.normalize"),
        truncation=choice(raw.get("truncation", "right"), "input.truncation", TRUNCATIONS),
        query_prefix=check_prefix(raw.get("query_prefix", ""), "input.query_prefix"),
        document_prefix=check_prefix(raw.get("document_prefix", ""), "input.document_prefix"),
        token_type_ids=_flag(raw.get("token_type_ids", False), "input.token_type_ids"),
        tokenizer_sha256=sha,
        tokenizer=tokenizer,
    )
    if spec.max_length < 2:
        raise EncoderError("input.max_length must leave room for a token besides the special ones (>= 2)")
    return spec


def check_prefix(value: Any, what: str) -> str:
    """A prefix as a graph may pin it: a string of at most :data:`MAX_PREFIX` printable characters.

    Raises:
        EncoderError: anything else (one line naming ``what``).
    """
    if not isinstance(value, str):
        raise EncoderError(f"{what} must be a string, got {show(value)}")
    if len(value) > MAX_PREFIX or not all(c.isprintable() for c in value):
        raise EncoderError(f"{what} must be at most {MAX_PREFIX} printable characters, got {show(value)}")
    return value


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise EncoderError(f"{what} must be true or false, got {show(value)}")
    return value
