"""A tokenizer as a team has it (a ``tokenizers`` JSON file or a WordPiece ``vocab.txt``), read
for ``rmq model stamp --tokenizer``: bounded, never a device or a pipe, one line for what is not
a tokenizer."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from rm_qdrant.core.inputspec import clip
from rm_qdrant.core.textspec import MAX_TOKENIZER_CHARS
from rm_qdrant.errors import ConfigError


def read_tokenizer(path: str | os.PathLike[str]) -> str:
    """A tokenizer file as a ``tokenizers`` JSON document: the file itself, or a WordPiece
    vocabulary (``vocab.txt``, one token a line) made into BERT's tokenizer (lower-cased when
    no token but the special ones has a capital letter, as uncased vocabularies are).

    Raises:
        ConfigError: no such file, too large, or neither kind of tokenizer (one line).
    """
    from tokenizers import Tokenizer

    path = Path(path)
    text = _read_text(path)
    if text.lstrip().startswith("{"):
        try:
            Tokenizer.from_str(text)
        except Exception as exc:  # tokenizers raises its own untyped errors
            raise ConfigError(
                f"{path} is JSON but not a tokenizer the 'tokenizers' library reads ({clip(str(exc))}): "
                "give the model's tokenizer.json or its vocab.txt"
            ) from exc
        return text
    tokens = [line for line in text.splitlines() if line]
    if "[UNK]" not in tokens or "[CLS]" not in tokens or "[SEP]" not in tokens:
        raise ConfigError(
            f"{path} is neither a tokenizers JSON file nor a WordPiece vocabulary with [UNK], [CLS] and [SEP]"
        )
    from tokenizers.implementations import BertWordPieceTokenizer

    cased = any(t != t.lower() for t in tokens if not (t.startswith("[") and t.endswith("]")))
    vocab = {token: index for index, token in enumerate(tokens)}
    return str(BertWordPieceTokenizer(vocab, lowercase=not cased).to_str())


def _read_text(path: Path) -> str:
    """A regular file's text, at most :data:`MAX_TOKENIZER_CHARS` bytes read (a device or a pipe
    has no size to check first: ``/dev/zero`` never ends, a FIFO waits for a writer)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"cannot read tokenizer {path}: not a regular file")
        if info.st_size > MAX_TOKENIZER_CHARS:
            raise ConfigError(f"{path} is {info.st_size:,} bytes: not a tokenizer (at most 32 MiB are read)")
        with path.open(encoding="utf-8") as file:
            text = file.read(MAX_TOKENIZER_CHARS + 1)  # the file may have grown since
        if len(text) > MAX_TOKENIZER_CHARS:
            raise ConfigError(f"{path} is over 32 MiB: not a tokenizer (at most 32 MiB are read)")
        return text
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not a tokenizer: not UTF-8 text (byte {exc.start}); give the model's tokenizer.json "
            "or its vocab.txt"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read tokenizer {path}: {exc.strerror or exc}") from exc


def stated_window(document: str) -> int | None:
    """The window a ``tokenizers`` JSON document states itself (``truncation.max_length``), or None."""
    try:
        truncation = json.loads(document).get("truncation")
    except (ValueError, AttributeError, RecursionError):
        return None
    value = truncation.get("max_length") if isinstance(truncation, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
