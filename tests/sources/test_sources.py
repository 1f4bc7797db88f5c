"""Fetching images from files and a real local HTTP server."""

from __future__ import annotations

import pytest

from rm_qdrant.errors import SourceError
from rm_qdrant.sources import ImageSource, SourceConfig, source_kind


def test_local_paths_file_uris_and_root(image_folder):
    one = sorted(image_folder.glob("a/*"))[0]
    data = one.read_bytes()
    with ImageSource(SourceConfig(root=image_folder)) as source:
        assert source.fetch(str(one)) == data
        assert source.fetch(f"a/{one.name}") == data
        assert source.fetch(one.as_uri()) == data


def test_http_fetch_and_retry(image_folder, http_images):
    one = sorted(image_folder.glob("b/*"))[0]
    with ImageSource(SourceConfig(backoff=0.01, allow_private=True)) as source:
        assert source.fetch(f"{http_images}/ok/b/{one.name}") == one.read_bytes()
        assert source.fetch(f"{http_images}/flaky/b/{one.name}") == one.read_bytes()  # two 503s, then 200


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/ok/a/missing.png", "HTTP 404"),
        ("/slow/a/000.jpg", r"timed out after 0.3 s \(the deadline of one attempt\) \(after 2 attempts\)"),
        ("/big/a/000.jpg", "over the 1000000-byte limit"),
    ],
)
def test_http_failures_say_why(http_images, path, message):
    config = SourceConfig(timeout=0.3, retries=1, backoff=0.01, max_bytes=1_000_000, allow_private=True)
    with ImageSource(config) as source, pytest.raises(SourceError, match=message):
        source.fetch(http_images + path)


def test_refused_disallowed_missing_and_oversized(tmp_path, closed_port, image_folder):
    with ImageSource(SourceConfig(retries=1, backoff=0.01, max_bytes=50, allow_private=True)) as source:
        with pytest.raises(SourceError, match="connection failed"):
            source.fetch(f"http://127.0.0.1:{closed_port}/x.jpg")
        with pytest.raises(SourceError, match="scheme 'ftp' is not allowed"):
            source.fetch("ftp://host/x.jpg")
        with pytest.raises(SourceError, match="No such file"):
            source.fetch(str(tmp_path / "nope.jpg"))
        with pytest.raises(SourceError, match="over the 50-byte limit"):
            source.fetch(str(sorted(image_folder.glob("a/*"))[0]))
        with pytest.raises(SourceError, match="no image URI"):
            source.fetch(None)
    with (
        ImageSource(SourceConfig(schemes=("file",))) as source,
        pytest.raises(SourceError, match="'http' is not allowed"),
    ):
        source.fetch("http://127.0.0.1/x.jpg")


@pytest.mark.parametrize(
    ("uri", "kind"),
    [
        ("/data/a.jpg", "file"),
        ("a/b.jpg", "file"),
        ("file:///data/a.jpg", "file"),
        ("https://user:s3cr3t@CDN.example.com:8443/a.jpg?sig=x", "https://cdn.example.com"),
        ("s3://bucket/key.jpg", "s3://bucket"),
        ("gs://bucket/key.jpg", "gs://bucket"),
        ("", None),
        (None, None),
    ],
)
def test_a_uri_s_source_kind_is_its_scheme_and_host_never_its_credentials(uri, kind):
    assert source_kind(uri) == kind  # what a pre-flight samples a few images of, each
