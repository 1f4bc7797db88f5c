"""--root confines local image paths: payloads are written by other systems, and a path
built from one (``..``, an absolute path, ``file://``, a symbolic link) never reads a
file outside the folder the operator named. Real files and links, the real CLI.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from rm_qdrant import open_store
from rm_qdrant.cli import cli
from rm_qdrant.core.planning import ERROR
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError, SourceError
from rm_qdrant.sources import ImageSource, SourceConfig
from tests.conftest import make_image_folder

OUTSIDE = "resolves outside --root"
CLIMBS = "climbs out of the uri template 'g1500/{sku}' with '..'"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``root/g1500`` (the gallery), ``root/data/test/dog/0001.jpg`` (elsewhere under the root),
    ``outside/secret.jpg`` (beside the root) and two links in the gallery: one out, one in."""
    images = sorted(make_image_folder(tmp_path / "images", per_class=3).glob("*/*"))
    root = tmp_path / "root"
    gallery = root / "g1500"
    gallery.mkdir(parents=True)
    for image in images:
        shutil.copy(image, gallery / f"{image.parent.name}{image.name}")
    (root / "data/test/dog").mkdir(parents=True)
    shutil.copy(images[0], root / "data/test/dog/0001.jpg")
    (tmp_path / "outside").mkdir()
    shutil.copy(images[1], tmp_path / "outside/secret.jpg")
    (gallery / "escape.jpg").symlink_to(tmp_path / "outside/secret.jpg")
    (gallery / "inner.jpg").symlink_to(root / "data/test/dog/0001.jpg")
    return tmp_path


def fetch(root: Path | None, uri: str) -> bytes:
    with ImageSource(SourceConfig(root=root)) as source:
        return source.fetch(uri)


@pytest.mark.parametrize(
    "uri",
    [
        "../outside/secret.jpg",
        "g1500/../../outside/secret.jpg",
        "{tmp}/outside/secret.jpg",
        "file://{tmp}/outside/secret.jpg",
        "g1500/escape.jpg",
        "/etc/passwd",
        "../../../../etc/passwd",
    ],
    ids=["dotdot", "dotdot-deeper", "absolute", "file-uri", "symlink-out", "etc-passwd", "dotdot-passwd"],
)
def test_a_path_that_resolves_outside_the_root_is_refused(tree, uri):
    uri = uri.format(tmp=tree)
    with pytest.raises(SourceError) as caught:
        fetch(tree / "root", uri)
    assert str(caught.value) == f"{uri}: {OUTSIDE} ({(tree / 'root').resolve()}); refused"


@pytest.mark.parametrize(
    ("uri", "target"),
    [
        ("g1500/a001.png", "root/g1500/a001.png"),
        ("g1500/../data/test/dog/0001.jpg", "root/data/test/dog/0001.jpg"),
        ("g1500/inner.jpg", "root/data/test/dog/0001.jpg"),
        ("{tmp}/root/g1500/a001.png", "root/g1500/a001.png"),
        ("file://{tmp}/root/g1500/a001.png", "root/g1500/a001.png"),
    ],
    ids=["relative", "dotdot-inside", "symlink-inside", "absolute-inside", "file-uri-inside"],
)
def test_a_path_that_stays_under_the_root_is_read(tree, uri, target):
    assert fetch(tree / "root", uri.format(tmp=tree)) == (tree / target).read_bytes()


def test_the_root_may_itself_be_a_link(tree):
    (tree / "link-to-root").symlink_to(tree / "root")
    assert fetch(tree / "link-to-root", "g1500/a001.png") == (tree / "root/g1500/a001.png").read_bytes()
    with pytest.raises(SourceError, match=OUTSIDE):
        fetch(tree / "link-to-root", "g1500/escape.jpg")


def test_a_root_that_cannot_be_resolved_is_a_config_error(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(ConfigError, match=r"^--root .*loop cannot be resolved: "):
        ImageSource(SourceConfig(root=tmp_path / "loop"))


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_root_that_is_not_a_folder_is_a_config_error(tmp_path, kind):
    """A mistyped --root would fail every point of a run one by one, as 'outside --root'."""
    root = tmp_path / "typo"
    if kind == "file":
        root.write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"^--root .*typo is not a folder$"):
        ImageSource(SourceConfig(root=root))


def test_without_a_root_a_path_is_read_as_given(tree):
    """Documented: no --root, no confinement (the operator trusts the payloads' paths)."""
    assert fetch(None, str(tree / "outside/secret.jpg")) == (tree / "outside/secret.jpg").read_bytes()


def test_a_template_value_that_climbs_is_refused_before_any_fetch():
    rule = UriRule(template="g1500/{sku}")
    assert rule.uri(1, {"sku": "dog/0001.jpg"}) == "g1500/dog/0001.jpg"
    assert rule.uri(1, {"sku": "x..y.jpg"}) == "g1500/x..y.jpg"
    for value in ("../data/test/dog/0001.jpg", "a/../../b.jpg", "..", "%2e%2e/x.jpg", "a\\..\\b.jpg"):
        with pytest.raises(SourceError, match=r"payload 'sku' = .* climbs out of the uri template"):
            rule.uri(1, {"sku": value})
    web = UriRule(template="https://cdn.example.com/{category}/{sku}.jpg")
    with pytest.raises(SourceError, match="climbs out"):
        web.uri(1, {"category": "../private", "sku": "x"})


def rmq(store_path: Path, *args: object):
    result = CliRunner().invoke(cli, ["--qdrant", str(store_path), *map(str, args)])
    assert result.exit_code == 0, result.output
    return result


def migrate_with(tree: Path, models, payloads: dict[int, dict], *init: str) -> tuple[dict, dict]:
    """Index the gallery, give points ``payloads`` (by position), then init and migrate under --root.

    Returns the migration's JSON report and the recorded error of every point still in old.
    """
    store_path = tree / "q"
    rmq(store_path, "index", "--collection", "old", "--data", tree / "images", "--encoder", models.old)
    with open_store(store_path) as store:
        points = sorted(store.scroll("old", limit=100)[0], key=lambda r: r.payload["uri"])
        names = {p.id: f"{Path(p.payload['uri']).parent.name}{Path(p.payload['uri']).name}" for p in points}
        updates = [
            (p.id, payloads.get(k, {"sku": names[p.id], "uri": f"g1500/{names[p.id]}"}))
            for k, p in enumerate(points)
        ]
        store.set_payload("old", updates)
    rmq(store_path, "init", "--name", "p", "--old-collection", "old", "--encoder", models.rm, *init)
    args = ("migrate", "--name", "p", "--root", tree / "root", "--max-failures", "1", "--json")
    report = json.loads(rmq(store_path, *args).output)
    with open_store(store_path) as store:
        left = store.scroll("old", limit=100)[0]
        errors = {p.payload.get("sku", p.payload.get("uri")): p.payload.get(ERROR) for p in left}
        assert store.count("p-new") == report["moved"]
    return report, errors


def test_migrate_records_template_escapes_as_failed_and_moves_the_rest(tree, models):
    payloads = {
        0: {"sku": "../data/test/dog/0001.jpg"},  # under the root, outside g1500
        1: {"sku": "escape.jpg"},  # a link in the gallery to a file outside the root
        2: {"sku": "../../outside/secret.jpg"},
        3: {"sku": "../../../../etc/passwd"},
        4: {"sku": "inner.jpg"},  # a link that stays under the root: read
    }
    report, errors = migrate_with(tree, models, payloads, "--uri-template", "g1500/{sku}")
    assert (report["moved"], report["failed"]) == (9 - 4, 4)
    assert set(errors) == {p["sku"] for k, p in payloads.items() if k < 4}
    assert errors["escape.jpg"] == f"g1500/escape.jpg: {OUTSIDE} ({(tree / 'root').resolve()}); refused"
    for sku in ("../data/test/dog/0001.jpg", "../../outside/secret.jpg", "../../../../etc/passwd"):
        assert errors[sku] == f"payload 'sku' = {sku!r} {CLIMBS}; refused"


def test_migrate_records_field_paths_outside_the_root_as_failed_and_moves_the_rest(tree, models):
    secret = tree / "outside/secret.jpg"
    payloads = {
        0: {"uri": str(secret)},
        1: {"uri": "../outside/secret.jpg"},
        2: {"uri": secret.as_uri()},
        3: {"uri": "g1500/escape.jpg"},
        4: {"uri": str(tree / "root/g1500/inner.jpg")},  # absolute, under the root: read
    }
    report, errors = migrate_with(tree, models, payloads)
    assert (report["moved"], report["failed"]) == (9 - 4, 4)
    root = (tree / "root").resolve()
    assert errors == {
        p["uri"]: f"{p['uri']}: {OUTSIDE} ({root}); refused" for k, p in payloads.items() if k < 4
    }
