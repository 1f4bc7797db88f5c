"""A graph that names an external data file makes ONNX Runtime read that file from the
current directory; rm-qdrant refuses such graphs before ONNX Runtime sees them.

Real graphs built with onnx.helper, real ONNX Runtime, the real CLI on the embedded store.
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from rm_qdrant import InputSpec, OnnxEncoder, create_pair, open_store
from rm_qdrant.cli import cli
from rm_qdrant.core.modelinfo import ModelInfo, parse_metadata
from rm_qdrant.errors import ConfigError, EncoderError
from rm_qdrant.models.encoder import fingerprint_bytes
from rm_qdrant.models.stamp import stamp_model
from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import make_image_folder

SPEC = InputSpec(height=8, width=8, channels=3)
SECRET = b"SECRET=hunter2pw!!!".ljust(256, b"#")  # ASCII: every 4 bytes are a finite float32
OLD_DIM, NEW_DIM = 32, 64


def external(name: str, dim: int, location: str = "ok.bin") -> onnx.TensorProto:
    """A (1, dim) float tensor whose bytes ONNX Runtime reads from ``location``."""
    tensor = helper.make_tensor(name, TensorProto.FLOAT, [1, dim], b"\0" * 4 * dim, raw=True)
    onnx.external_data_helper.set_external_data(tensor, location=location, offset=0, length=4 * dim)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def ones_column() -> list[onnx.NodeProto]:
    """Nodes from the uint8 image input ``x`` to ``one``, an (N, 1) column of ones."""
    return [
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["xf", "axes"], ["mean"], keepdims=0),
        helper.make_node("Unsqueeze", ["mean", "ax1"], ["col"]),
        helper.make_node("Mul", ["col", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "onef"], ["one"]),
    ]


def constants() -> list[onnx.TensorProto]:
    return [
        numpy_helper.from_array(np.array([1, 2, 3], np.int64), "axes"),
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(1.0, np.float32), "onef"),
    ]


def in_a_constant(name: str, dim: int) -> list[onnx.NodeProto]:
    return [helper.make_node("Constant", [], [name], value=external(f"{name}_value", dim))]


def in_a_branch(name: str, dim: int) -> list[onnx.NodeProto]:
    """An ``If`` whose branches hold the external tensor in a Constant of their own subgraph."""

    def branch(tag: str) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(f"{name}_{tag}", TensorProto.FLOAT, [1, dim])
        node = helper.make_node("Constant", [], [f"{name}_{tag}"], value=external(f"{name}_{tag}_value", dim))
        return helper.make_graph([node], f"{name}_{tag}", [], [out])

    cond = helper.make_node(
        "Constant", [], [f"{name}_cond"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True])
    )
    choose = helper.make_node(
        "If", [f"{name}_cond"], [name], then_branch=branch("then"), else_branch=branch("else")
    )
    return [cond, choose]


def in_a_function_default(name: str, dim: int) -> tuple[onnx.NodeProto, onnx.FunctionProto]:
    """A call of a model-local function whose attribute's default (``attribute_proto``) is the
    external tensor: the call does not set the attribute, so the default is read."""
    body = helper.make_node("Constant", [], ["out"])
    body.attribute.append(
        helper.AttributeProto(name="value", ref_attr_name="value", type=helper.AttributeProto.TENSOR)
    )
    function = helper.make_function(
        "hostile", f"Get_{name}", [], ["out"], [body], [helper.make_opsetid("", 18)], attributes=[]
    )
    function.attribute_proto.append(helper.make_attribute("value", external(f"{name}_default", dim)))
    return helper.make_node(f"Get_{name}", [], [name], domain="hostile"), function


def hostile_graph(path: Path, dims: dict[str, int], where: str = "initializer") -> Path:
    """An encoder whose every output, for any image, is the first bytes of ``./ok.bin``."""
    nodes, inits, functions = ones_column(), constants(), []
    for role, dim in dims.items():
        if where == "initializer":
            inits.append(external(f"s_{role}", dim))
        elif where == "function":
            call, function = in_a_function_default(f"s_{role}", dim)
            nodes.append(call)
            functions.append(function)
        else:
            nodes += (in_a_constant if where == "constant" else in_a_branch)(f"s_{role}", dim)
        nodes.append(helper.make_node("MatMul", ["one", f"s_{role}"], [role]))
    graph = helper.make_graph(
        nodes,
        "hostile",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, ["N", 8, 8, 3])],
        [helper.make_tensor_value_info(role, TensorProto.FLOAT, ["N", dim]) for role, dim in dims.items()],
        inits,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("hostile", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=functions)
    model.ir_version = 8
    helper.set_model_props(model, ModelInfo("hostile", "cosine", dims, SPEC).to_metadata())
    path.write_bytes(model.SerializeToString())  # onnx.save would try to write the external data
    return path


@pytest.fixture
def secret_in_cwd(tmp_path, monkeypatch) -> Path:
    """The working directory holds ``ok.bin``, a file no image encoder should ever read."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.bin").write_bytes(SECRET)
    return tmp_path


@pytest.mark.parametrize("where", ["initializer", "function"])
def test_the_hostile_graph_really_reads_the_file_when_given_to_onnx_runtime(secret_in_cwd, where):
    """The premise of the tests below: ONNX Runtime alone returns the secret as an embedding."""
    data = hostile_graph(secret_in_cwd / "h.onnx", {"embedding": NEW_DIM}, where).read_bytes()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    (out,) = session.run(["embedding"], {"x": np.zeros((1, 8, 8, 3), np.uint8)})
    assert out.astype(np.float32).tobytes() == SECRET


@pytest.mark.parametrize("where", ["initializer", "constant", "branch", "function"])
def test_the_encoder_refuses_a_graph_that_reads_another_file(secret_in_cwd, where):
    path = hostile_graph(secret_in_cwd / "h.onnx", {"embedding": NEW_DIM}, where)
    with pytest.raises(EncoderError) as caught:
        OnnxEncoder(path)
    message = str(caught.value)
    tensor = "s_embedding" if where == "initializer" else "s_embedding_"
    assert message.startswith(f"{path}: tensor '{tensor}")
    assert "keeps its data in an external file, 'ok.bin'" in message
    assert "\n" not in message and "SECRET" not in message


def test_a_hostile_file_name_stays_one_bounded_line(secret_in_cwd):
    model = onnx.load(
        str(hostile_graph(secret_in_cwd / "h.onnx", {"embedding": NEW_DIM})), load_external_data=False
    )
    for entry in model.graph.initializer[-1].external_data:
        if entry.key == "location":
            entry.value = "x\nError: all good\n" + "y" * 5000
    path = secret_in_cwd / "long.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(EncoderError) as caught:
        OnnxEncoder(path)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 600


def test_stamp_refuses_external_data_inside_a_subgraph(secret_in_cwd):
    """stamp checked the top-level initializers only; a Constant in an If branch went through."""
    path = hostile_graph(secret_in_cwd / "h.onnx", {"embedding": NEW_DIM}, "branch")
    out = secret_in_cwd / "stamped.onnx"
    with pytest.raises(
        ConfigError, match=r"tensor 's_embedding_(then|else)_value' keeps its data in an external"
    ):
        stamp_model(path, out, outputs={"embedding": "embedding"}, size=8)
    assert not out.exists()


def rmq(store_path: Path, *args: object):
    return CliRunner().invoke(cli, ["--qdrant", str(store_path), *map(str, args)])


def refused(result, path: Path) -> None:
    """One ``Error:`` line naming the graph and the tensor, exit 1, no traceback."""
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: tensor 's_"), result.output
    assert "external file, 'ok.bin'" in lines[0] and "Traceback" not in result.output


def test_rmq_index_with_a_hostile_encoder_writes_nothing(secret_in_cwd):
    images = make_image_folder(secret_in_cwd / "images", per_class=2)
    model = hostile_graph(secret_in_cwd / "h.onnx", {"embedding": NEW_DIM})
    store_path = secret_in_cwd / "q"
    result = rmq(store_path, "index", "--collection", "g", "--data", images, "--encoder", model)
    refused(result, model)
    with open_store(store_path) as store:
        assert not store.has_collection("g") or store.count("g") == 0


def recorded_encoder(path: Path) -> types.SimpleNamespace:
    """What an earlier release recorded for the graph at ``path``: its name, fingerprint and outputs."""
    data = path.read_bytes()
    model = onnx.ModelProto.FromString(data)
    meta = {p.key: p.value for p in model.metadata_props}
    info = parse_metadata(meta, [o.name for o in model.graph.output], source=str(path))
    return types.SimpleNamespace(path=path, fingerprint=fingerprint_bytes(data), info=info)


def test_rmq_migrate_with_a_hostile_encoder_moves_nothing(secret_in_cwd, monkeypatch):
    """A pair recorded before this check (by an earlier release) for a hostile graph."""
    # An earlier release neither refused the graph nor ran it at init.
    monkeypatch.setattr("rm_qdrant.operations.create.check_output_sizes", lambda model: None)
    images = make_image_folder(secret_in_cwd / "images", per_class=2)
    weights = np.random.default_rng(0).normal(size=(8 * 8 * 3, OLD_DIM))
    old = linear_encoder(
        secret_in_cwd / "old.onnx", [("embedding", "pixels", weights)], input_spec=SPEC, name="o"
    )
    store_path = secret_in_cwd / "q"
    assert rmq(store_path, "index", "--collection", "old", "--data", images, "--encoder", old).exit_code == 0
    model = hostile_graph(secret_in_cwd / "h.onnx", {"new": NEW_DIM, "rev": OLD_DIM})
    with open_store(store_path) as store:
        create_pair(store, "p", old_collection="old", encoder=recorded_encoder(model))  # type: ignore[arg-type]
        total = store.count("old")
    refused(rmq(store_path, "migrate", "--name", "p"), model)
    with open_store(store_path) as store:
        assert (store.count("old"), store.count("p-new")) == (total, 0)
