"""benchmarks/photo_gallery.py gives what its manifest says, the same bytes for the same seed, and
benchmarks/photo_throughput.py --quick runs end to end on a tiny gallery of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from benchmarks import photo_gallery
from rm_qdrant.caches import cache_root

ROOT = Path(__file__).resolve().parents[2]
TINY = (("64x43", 64, 43), ("160x107", 160, 107))


@pytest.fixture(scope="module")
def gallery(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    return photo_gallery.build(tmp_path_factory.mktemp("photos"), per_class=10, classes=TINY)


def test_each_photo_is_what_the_manifest_says(gallery: tuple[Path, list[dict]]) -> None:
    folder, entries = gallery
    assert photo_gallery.read_manifest(folder) == entries
    for entry in entries:
        path = folder / entry["file"]
        with Image.open(path) as image:
            assert (image.format, image.mode, image.size) == (
                entry["format"],
                entry["mode"],
                (entry["width"], entry["height"]),
            )
            assert image.getexif().get(0x0112, 1) == entry["orientation"]
            if entry["format"] == "JPEG":
                assert bool(image.info.get("progressive")) == entry["progressive"]
                factors = {layer[1:3] for layer in image.layer}  # type: ignore[attr-defined]
                sampling = None if entry["mode"] == "L" else "4:4:4" if len(factors) == 1 else "4:2:0"
                assert sampling == entry["subsampling"]
        assert path.stat().st_size == entry["bytes"]
        name, wide, high = next(c for c in TINY if c[0] == entry["size_class"])
        assert {entry["width"], entry["height"]} == {wide, high}
        if entry["quality"] is not None:
            assert 85 <= entry["quality"] <= 95


def test_the_gallery_has_every_kind_of_photo(gallery: tuple[Path, list[dict]]) -> None:
    _, entries = gallery
    for size_class, _, _ in TINY:
        mine = [e for e in entries if e["size_class"] == size_class]
        assert {e["format"] for e in mine} == {"JPEG", "PNG", "WEBP"}
        assert {e["mode"] for e in mine} == {"RGB", "L", "CMYK"}
        assert {e["orientation"] for e in mine} == {1, 6, 8}
        assert {e["subsampling"] for e in mine} >= {"4:2:0", "4:4:4"}
        assert any(e["progressive"] for e in mine)
        assert {e["width"] > e["height"] for e in mine} == {True, False}  # landscape and portrait


def test_the_same_seed_gives_the_same_bytes(gallery: tuple[Path, list[dict]], tmp_path: Path) -> None:
    folder, entries = gallery
    again, _ = photo_gallery.build(tmp_path / "again", per_class=10, classes=TINY)
    for entry in entries:
        assert (again / entry["file"]).read_bytes() == (folder / entry["file"]).read_bytes()
    other, _ = photo_gallery.build(tmp_path / "other", per_class=1, seed=1, classes=TINY)
    assert (other / entries[0]["file"]).read_bytes() != (folder / entries[0]["file"]).read_bytes()


def test_a_matching_gallery_is_reused_and_a_changed_one_rebuilt(tmp_path: Path) -> None:
    folder, entries = photo_gallery.build(tmp_path, per_class=1, classes=TINY)
    first = folder / entries[0]["file"]
    before = first.stat().st_mtime_ns
    os.utime(first, ns=(before - 10**9, before - 10**9))
    photo_gallery.build(tmp_path, per_class=1, classes=TINY)
    assert first.stat().st_mtime_ns == before - 10**9  # reused: not written again
    first.write_bytes(b"truncated")
    photo_gallery.build(tmp_path, per_class=1, classes=TINY)
    assert first.stat().st_size == entries[0]["bytes"]


def test_the_default_folder_is_under_the_cache_folder() -> None:
    folder = photo_gallery.default_folder()
    assert folder == cache_root() / "photo-gallery-v1"
    assert photo_gallery.default_folder(per_class=1, classes=TINY).parent == cache_root()


def test_the_cli_builds_a_gallery(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "photo_gallery.py"), "--out", str(tmp_path)]
        + ["--per-class", "1", "--classes", "64x43,96x64"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "2 photos" in done.stdout
    lines = (tmp_path / photo_gallery.MANIFEST).read_text().splitlines()
    assert [json.loads(line)["size_class"] for line in lines] == ["64x43", "96x64"]


def test_the_throughput_benchmark_runs_quick(gallery: tuple[Path, list[dict]], tmp_path: Path) -> None:
    folder, _ = gallery
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "photo_throughput.py"), "--quick"]
        + ["--gallery", str(folder), "--json", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "exact ≠ before on 0 (none)" in done.stdout
    assert "## Goals of issue 42" in done.stdout
    assert "not measured (class absent)" in done.stdout  # no 4000x2667 class here, and it says so
    figures = json.loads(out.read_text())
    assert list(figures["classes"]) == ["64x43", "160x107"]
    decoded = figures["classes"]["160x107"]["migration"]["decoded_as"]
    assert decoded == {"exact": "exact", "fast": "fast"}
