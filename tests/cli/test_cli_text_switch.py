"""Text pairs: a switch to a graph that cuts long documents another way is refused (a sampled
check cannot see it)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rm_qdrant import open_store
from rm_qdrant.models.text_stamp import stamp_text_model
from tests.conftest import one_error_line
from tests.text_models import scaled_text_graph
from tests.text_pairs import TextModels, gallery, make_text_models, stamp


@pytest.fixture(scope="module")
def tm(tmp_path_factory: pytest.TempPathFactory) -> TextModels:
    """Old and new graphs whose vectors do not depend on padding (a masked context)."""
    folder = tmp_path_factory.mktemp("text-models")
    made = make_text_models(folder)
    old_raw = scaled_text_graph(folder / "old-masked.onnx", dim=16, seed=0)
    new_raw = scaled_text_graph(folder / "new-masked.onnx", dim=16, seed=1)
    return replace(
        made,
        old=stamp(old_raw, folder / "old-m.onnx", made.vocab, embedding="embedding"),
        new=stamp(new_raw, folder / "new-m.onnx", made.vocab, embedding="embedding"),
        new_raw=new_raw,
    )


def _init(rmq, tm):
    rmq("init", "--name", "p", "--old-collection", "articles", "--encoder", tm.new, "--old-encoder", tm.old,
        "--text-field", "body")  # fmt: skip


@pytest.mark.parametrize(
    ("window", "said"),
    [
        ({"max_length": 64}, "cuts documents at 64 tokens (keeping the start), the vectors already in "
         "'p-new' were made cut at 16 (keeping the start)"),
        ({"truncation": "left"}, "cuts documents at 16 tokens (keeping the end), the vectors already in "
         "'p-new' were made cut at 16 (keeping the start)"),
    ],
)  # fmt: skip
def test_switch_refuses_a_graph_that_cuts_long_documents_another_way(rmq, tm, tmp_path, window, said):
    """Every document in new is short, so re-encoding a sample agrees to the bit: the window's
    change would only show on a long document, embedded one way before the switch and another after."""
    gallery(tmp_path, tm)
    with open_store(tmp_path / "q") as store:  # LONG (id 39) is not in the gallery: new holds short texts
        store.delete("articles", [39])
    _init(rmq, tm)
    rmq("migrate", "--name", "p")
    other = tmp_path / "other.onnx"
    stamp_text_model(tm.new_raw, other, outputs={"embedding": "embedding"}, tokenizer=tm.vocab,
                     max_length=window.get("max_length", 16), truncation=window.get("truncation", "right"),
                     name="new")  # fmt: skip
    before = rmq("pairs", "--json").output
    line = one_error_line(rmq("switch-encoder", "--name", "p", "--encoder", other, ok=False))
    assert said in line and "longer documents would be embedded two ways" in line
    assert rmq("pairs", "--json").output == before
    same = tmp_path / "same.onnx"  # the same window, stamped again: the switch goes through
    stamp_text_model(tm.new_raw, same, outputs={"embedding": "embedding"}, tokenizer=tm.vocab, max_length=16,
                     name="again")  # fmt: skip
    assert (
        "pair 'p' now serves again (naive mode); checked on 39 points"
        in rmq("switch-encoder", "--name", "p", "--encoder", same).output
    )
