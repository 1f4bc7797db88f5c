"""Credentials never reach a message: every form the adversarial test found."""

from __future__ import annotations

import pytest

from rm_qdrant.core.redact import redact


@pytest.mark.parametrize(
    "uri",
    [
        "http://user:SECRET@host/a.png",
        "http://user:SEC/RET@host/a.png",  # "/" in the password
        "http://user:p@SECRET@host/x",  # "@" in the password
        "//user:SECRET@host/x",
        "http://h/x?api_key=SECRET",
        "http://h/x?client_secret=SECRET&a=1",
        "http://h/x?access_key=SECRET",
        "http://h/x?session_token=SECRET",
        "http://h/x?jwt=SECRET",
        "http://h/x?private_key=SECRET",
        "http://h/x?api%5Fkey=SECRET",
        "http://h/x#access_token=SECRET",
        "http://h/x;jsessionid=SECRET",
        "s3://b/k.jpg?X-Amz-Signature=SECRET&X-Amz-Credential=SECRET",
        "Error: cannot reach http://u:SECRET@h:6333/?api_key=SECRET (refused)",
    ],
)
def test_secrets_are_redacted(uri):
    assert "SECRET" not in redact(uri) and "***" in redact(uri)


@pytest.mark.parametrize(
    "uri",
    ["http://host/images/photo@2x.png", "https://cdn.example.com/a/b.jpg?size=200&v=3", "/data/x.jpg"],
)
def test_plain_uris_are_left_alone(uri):
    assert redact(uri) == uri
