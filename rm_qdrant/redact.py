"""Hiding credentials in URIs before they reach a log line, an error or a payload (pure).

Image URIs and Qdrant URLs may carry secrets: ``user:password@`` in the authority,
or a key in the query string (``?api_key=``, a presigned URL's signature). Every
message rm-qdrant writes about a URI goes through :func:`redact` first.
"""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s@]*@")
_SECRET_PARAMS = (
    "api[_-]?key|apikey|key|token|access[_-]?token|auth|password|passwd|pwd|secret|"
    "signature|sig|credential|security[_-]?token|x-amz-[a-z-]+|x-goog-[a-z-]+"
)
_QUERY_SECRET = re.compile(rf"(?P<name>[?&;](?:{_SECRET_PARAMS})=)[^&#\s'\"]*", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the credentials of every URI in it replaced by ``***``.

    >>> redact("http://user:pw@host/a.jpg?size=2&api_key=s3cr3t")
    'http://***@host/a.jpg?size=2&api_key=***'
    """
    return _QUERY_SECRET.sub(r"\g<name>***", _USERINFO.sub(r"\g<scheme>***@", text))
