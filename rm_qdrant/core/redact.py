"""Hiding credentials in URIs before they reach a log line, an error or a payload (pure).

Image URIs and Qdrant URLs may carry secrets: ``user:password@`` in the authority,
or a key in the query string (``?api_key=``, a presigned URL's signature). Every
message rm-qdrant writes about a URI goes through :func:`redact` first.
"""

from __future__ import annotations

import re

# The authority runs to the last "@" before the query: a password may hold "/" or "@".
_USERINFO = re.compile(r"(?P<start>(?:(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*:)?//)[^?#\s]*@")
# A parameter whose name mentions a secret, in the query, the fragment or a ;param.
_SECRET_NAME = r"[^=&#;?\s]*(?:key|token|secret|sig|pass|pwd|auth|credential|session|jwt|cookie)[^=&#;?\s]*"
_QUERY_SECRET = re.compile(rf"(?P<name>[?&;#]{_SECRET_NAME}=)[^&#;\s'\"]*", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the credentials of every URI in it replaced by ``***``.

    >>> redact("http://user:pw@host/a.jpg?size=2&api_key=s3cr3t")
    'http://***@host/a.jpg?size=2&api_key=***'
    """
    return _QUERY_SECRET.sub(r"\g<name>***", _USERINFO.sub(_userinfo, text))


def _userinfo(match: re.Match[str]) -> str:
    start, rest = match.group("start"), match.group(0)[len(match.group("start")) :]
    # "host/path/a@2x.png" has no credentials: only an authority with ":" or the whole
    # span before the first "/" counts as user information.
    if "/" in rest and ":" not in rest.split("@")[0]:
        return match.group(0)
    return f"{start}***@"
