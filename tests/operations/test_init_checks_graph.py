"""``rmq init`` runs the graph once before it writes: a graph whose metadata lies about its
vector sizes is refused in one line, and the team's collection is left as it was."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from rm_qdrant import open_store
from rm_qdrant.core.modelinfo import ModelInfo
from rm_qdrant.pair.record import META_COLLECTION
from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import NEW_DIM, OLD_DIM, SPEC, make_image_folder
from tests.migration.test_fault_injection import rmq

pytestmark = pytest.mark.slow


def lying_graph(models, path, outputs):
    """The shared rm graph (new: NEW_DIM values, rev: OLD_DIM) with metadata that states ``outputs``."""
    model = onnx.load(str(models.rm))
    helper.set_model_props(model, ModelInfo("liar", "cosine", outputs, SPEC).to_metadata())
    onnx.save(model, str(path))
    return path


LAYOUTS = {
    "paired": ["--old-collection", "photos"],
    "single": ["--mode", "single-collection", "--collection", "photos", "--new-vector", "new"],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(
    ("outputs", "said"),
    [
        (
            {"new": 65_536, "rev": OLD_DIM},
            f"output 'new' has {NEW_DIM} values per image, metadata says 65536",
        ),
        ({"new": NEW_DIM, "rev": 3}, f"output 'rev' has {OLD_DIM} values per image, metadata says 3"),
    ],
)
def test_init_refuses_a_graph_whose_outputs_are_not_the_sizes_its_metadata_says(
    tmp_path, models, layout, outputs, said
):
    store_path = tmp_path / "q"
    old = models.old
    if outputs["rev"] != OLD_DIM:  # the old collection holds vectors of the size rev claims to make
        old = linear_encoder(
            tmp_path / "old3.onnx",
            [("embedding", "pixels", models.w_old[:, :3])],
            input_spec=SPEC,
            name="old3",
        )
    images = make_image_folder(tmp_path / "g", per_class=2)
    rmq(store_path, "index", "--collection", "photos", "--data", images, "--encoder", old)
    liar = lying_graph(models, tmp_path / "liar.onnx", outputs)
    with open_store(store_path) as store:
        before = (
            store.list_collections(),
            store.collection("photos").vectors,
            store.scroll(META_COLLECTION, limit=100)[0],
        )
    result = rmq(store_path, "init", "--name", "p", "--encoder", liar, *LAYOUTS[layout], ok=False)
    assert result.exit_code == 1 and said in result.output, result.output
    assert result.output.startswith("Error: ") and len(result.output.strip().splitlines()) == 1
    with open_store(store_path) as store:
        after = (
            store.list_collections(),
            store.collection("photos").vectors,
            store.scroll(META_COLLECTION, limit=100)[0],
        )
    assert after == before  # no new collection, no new vector, no pair record
