"""What ``rmq`` prints is safe to print: no credentials, no terminal escapes, no tracebacks,
and an exit status that tells a refusal to keep a result from a failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rm_qdrant import OnnxEncoder, create_pair, index_images, open_store, scan_image_folder
from rm_qdrant.cli import cli
from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import SPEC, make_image_folder, settled

EVIL = "evil\x1b]0;pwned\x07\rforged"
SECRET = "hunter2pw"
DECLINED = 3  # the exit status of a command that ran and refused to keep its result


def invoke(store: Path, *args: object) -> object:
    return CliRunner().invoke(cli, ["--qdrant", str(store), *map(str, args)])


def rmq_process(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rm_qdrant", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), output[:2000]
    return lines[0]


@pytest.fixture
def naive(tmp_path, models):
    """A naive pair whose old and new models are the same: its plain merge is already perfect."""
    store = tmp_path / "q"
    images = make_image_folder(tmp_path / "images")
    result = invoke(store, "index", "--collection", "gallery", "--data", images, "--encoder", models.new_only)
    assert result.exit_code == 0, result.output
    init = ["init", "--name", "p", "--old-collection", "gallery", "--encoder", models.new_only]
    result = invoke(store, *init, "--old-encoder", models.new_only, "--mode", "naive")
    assert result.exit_code == 0, result.output
    return store, images


# --- secrets ---


@pytest.mark.slow
def test_verbose_migration_from_s3_logs_neither_the_session_token_nor_the_key_id(
    tmp_path, models, bucket, aws
):
    name, put = bucket
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=2))
    folder = tmp_path / "q"
    with open_store(folder, create=True) as store:
        index_images(store, "old", OnnxEncoder(models.old), items)
        for item in items:
            put(f"g/{item.point_id}.img", Path(item.uri).read_bytes())
        store.set_payload("old", [(i.point_id, {"uri": f"s3://{name}/g/{i.point_id}.img"}) for i in items])
        create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "AKIDSECRETKEYIDXYZ",
        "AWS_SECRET_ACCESS_KEY": "secretaccesskeyXYZ",
        "AWS_SESSION_TOKEN": "SESSIONTOKENSECRETXYZ",
    }
    done = rmq_process("--qdrant", folder, "-vv", "migrate", "--name", "p", "--json", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["moved"] == len(items)  # the images did come from S3
    assert "acknowledged" in done.stderr  # -vv logged every batch
    for secret in ("AKIDSECRETKEYIDXYZ", "SESSIONTOKENSECRETXYZ", "secretaccesskeyXYZ"):
        assert secret not in done.stderr and secret not in done.stdout


def test_init_and_pairs_never_print_a_password_in_the_uri_template(naive, models):
    store, images = naive
    template = f"https://user:{SECRET}@images.example.com/{{sku}}.jpg"
    assert (
        invoke(store, "index", "--collection", "g2", "--data", images, "--encoder", models.old).exit_code == 0
    )
    init = ["init", "--name", "t", "--old-collection", "g2", "--encoder", models.rm]
    outputs = [
        invoke(store, *init, "--uri-template", template).output,
        invoke(store, "pairs").output,
        invoke(store, "pairs", "--json").output,
        invoke(store, "drop-pair", "t").output,
        invoke(store, *init, "--uri-template", template, "--json").output,
    ]
    assert "https://user:***@images.example.com/{sku}.jpg" not in outputs[0]  # the whole authority goes
    assert "https://***@images.example.com/{sku}.jpg" in outputs[0]
    assert all(SECRET not in out for out in outputs), outputs
    pairs = {p["name"]: p for p in json.loads(outputs[2])}
    assert pairs["t"]["uri_template"] == "https://***@images.example.com/{sku}.jpg"


# --- terminal escapes ---


def test_a_model_name_with_terminal_escapes_is_printed_escaped(tmp_path, models, image_folder):
    evil = linear_encoder(
        tmp_path / "evil.onnx",
        [("new", "pixels", models.w_new), ("rev", "new", models.w_rev)],
        input_spec=SPEC,
        name=EVIL,
    )
    store = tmp_path / "q"
    invoke(store, "index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    created = invoke(store, "init", "--name", "p", "--old-collection", "gallery", "--encoder", evil)
    assert created.exit_code == 0, created.output
    for args in (
        ["pairs"],
        ["status", "--name", "p"],
        ["pairs", "--json"],
        ["status", "--name", "p", "--json"],
    ):
        out = invoke(store, *args).output
        assert not set(out) & {"\x1b", "\x07", "\r"}, (args, out)
        if "--json" in args:
            assert EVIL in out.replace("\\u001b", "\x1b").replace("\\u0007", "\x07").replace("\\r", "\r")
        else:
            assert "evil\\x1b]0;pwned\\x07\\rforged" in out, out


@pytest.mark.slow
def test_a_paused_migration_prints_the_pair_name_escaped(tmp_path, models, image_folder):
    """The line a migration held by rmq pause writes on stderr names the pair: escaped."""
    folder = tmp_path / "q"
    with open_store(folder, create=True) as store:
        index_images(store, "gallery", OnnxEncoder(models.old), scan_image_folder(image_folder))
        create_pair(store, EVIL, old_collection="gallery", new_collection="n", encoder=OnnxEncoder(models.rm))
    assert invoke(folder, "pause", EVIL).exit_code == 0
    command = [sys.executable, "-m", "rm_qdrant", "--qdrant", str(folder), "migrate", "--name", EVIL]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        while line and "paused by rmq pause" not in line:
            line = proc.stderr.readline()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert "rmq resume evil\\x1b]0;pwned\\x07\\rforged" in line, line
    assert not set(line) & {"\x1b", "\x07", "\r"}, line


def test_a_store_path_with_escapes_in_an_error_is_printed_escaped(tmp_path):
    result = invoke(tmp_path / "q\x1b]0;pwned\x07\rx", "status", "--name", "p")
    line = one_error_line(result.output)
    assert not set(line) & {"\x1b", "\x07", "\r"} and "q\\x1b]0;pwned\\x07\\rx" in line, line


# --- one line, exit 1, for every bad value ---

LONG = "x" * 5000


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["probe", "--name", "p", "--seed", "-1"], "--seed"),
        (["calibrate", "--name", "p", "--seed", "-1", "SMALL"], "--seed"),
        (["migrate", "--name", "p", "--order", "centroid-unsupervised", "--seed", "-1"], "--seed"),
        (["fit", "--name", "p", "--seed", "-1", "BACKBONE", "SMALL"], "--seed"),
        (["fit", "--name", "p", "--lr", "nan", "BACKBONE", "SMALL"], "--lr"),
        (["fit", "--name", "p", "--lr", "1e309", "BACKBONE", "SMALL"], "--lr"),
        (["calibrate", "--name", "p", "--holdout", "nan"], "--holdout"),
        (["migrate", "--name", "p", "--max-failures", "nan"], "--max-failures"),
        (["index", "--collection", LONG, "--data", "IMAGES", "--encoder", "OLD"], "too long"),
        (["index", "--collection", "c", "--data", f"{LONG}/x", "--encoder", "OLD"], "too long"),
        (["--qdrant", f"./{LONG}", "status", "--name", "p"], "too long"),
        # what Python makes of a non-UTF-8 argument (b'\xff\xfe')
        (["status", "--name", "\udcff\udcfe"], "not text"),
        (["search", "--name", "\udcff\udcfe", "IMAGES"], "not text"),
        (["drop-pair", "\udcff\udcfe"], "not UTF-8"),
        (["init", "--name", "p\udcff", "--old-collection", "old", "--encoder", "OLD"], "not text"),
    ],
    ids=lambda v: v[:40] if isinstance(v, str) else None,
)
def test_bad_values_are_one_error_line_and_exit_1(naive, models, tmp_path, args, says):
    store, images = naive
    fill = {"BACKBONE": ["--backbone", models.new_only, "--out", tmp_path / "x.onnx"]}
    fill |= {"IMAGES": [images], "OLD": [models.old], "SMALL": ["--sample", 24, "--holdout", 0.5, "--k", 3]}
    args = [part for arg in args for part in fill.get(arg, [arg])]
    result = invoke(store, *args) if args[0] != "--qdrant" else CliRunner().invoke(cli, list(map(str, args)))
    assert result.exit_code == 1 and not isinstance(result.exception, Exception), result.exception
    line = one_error_line(result.output)
    assert says in line and len(line) < 400, line
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.slow
def test_an_api_key_over_http_is_one_warning_line_not_a_warning_per_error(closed_port):
    done = rmq_process(
        "--qdrant", f"http://127.0.0.1:{closed_port}", "--api-key", "k", "status", "--name", "p"
    )
    lines = done.stderr.splitlines()
    assert done.returncode == 1, done.stderr
    assert "UserWarning" not in done.stderr and "warnings.warn" not in done.stderr
    assert [line.split(":")[0] for line in lines] == ["Warning", "Error"], lines
    assert "--api-key" in lines[0] and "http://" in lines[0]


def test_train_settings_must_be_finite(tmp_path):
    pytest.importorskip("torch")
    result = CliRunner().invoke(cli, ["train", "backbone", "--set", "lr=nan", "--data", tmp_path / "none"])
    line = one_error_line(result.output)
    assert "lr" in line and "finite" in line
    result = CliRunner().invoke(cli, ["train", "backbone", "--set", "seed=-1", "--data", tmp_path / "none"])
    assert "seed" in one_error_line(result.output)
    result = CliRunner().invoke(cli, ["train", "backbone", "--mean", "nan,0,0", "--data", tmp_path / "none"])
    assert "--mean" in one_error_line(result.output)


# --- a command that ran but kept nothing: exit 3 and one "Not kept:" line ---


def not_kept(result: object) -> str:
    assert result.exit_code == DECLINED, (result.exit_code, result.output)
    assert "Error" not in result.stderr and "Traceback" not in result.output, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("Not kept: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.slow
def test_calibrate_that_keeps_no_map_exits_3_with_one_not_kept_line(naive):
    store, _ = naive
    args = ["calibrate", "--name", "p", "--sample", "24", "--holdout", "0.5", "--k", "3"]
    line = not_kept(invoke(store, *args))
    assert "plain merge" in line and "--force" in line
    report = invoke(store, *args, "--json")
    not_kept(report)
    assert json.loads(report.stdout)["kept"] is False
    assert not json.loads(invoke(store, "status", "--name", "p", "--json").output)["calibrated"]


@pytest.mark.slow
def test_fit_that_writes_no_graph_exits_3_with_one_not_kept_line(naive, models, tmp_path):
    pytest.importorskip("torch")
    store, _ = naive
    out = tmp_path / "fitted.onnx"
    args = ["fit", "--name", "p", "--sample", "24", "--holdout", "0.5", "--k", "3"]
    args += ["--backbone", models.new_only, "--out", out, "--loss", "rqt", "--steps", "1", "--lr", "1e-9"]
    line = not_kept(invoke(store, *args))
    assert "naive merge" in line and "--force" in line and not out.exists()


def test_switch_encoder_that_refuses_exits_3_with_one_not_kept_line(naive, models, tmp_path):
    store, _ = naive
    assert invoke(store, "migrate", "--name", "p", "--limit", "6").exit_code == 0
    before = settled(invoke(store, "status", "--name", "p", "--json").output)
    rotated = linear_encoder(
        tmp_path / "rotated.onnx",
        [("embedding", "pixels", models.w_new[:, ::-1])],
        input_spec=SPEC,
        name="rotated",
    )
    line = not_kept(invoke(store, "switch-encoder", "--name", "p", "--encoder", rotated))
    assert "does not reproduce the vectors already in" in line
    as_json = invoke(store, "switch-encoder", "--name", "p", "--encoder", rotated, "--json")
    not_kept(as_json)  # the report on stdout, the one line on stderr
    report = json.loads(as_json.stdout)
    assert report["switched"] is False and report["check"]["checked"] == 6
    assert settled(invoke(store, "status", "--name", "p", "--json").output) == before  # the pair is as it was
