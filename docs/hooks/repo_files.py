"""MkDocs hook: links from the docs to files outside docs/ work on the site too.

A page links a result file as GitHub shows it, relative to the page
(``[fit-summary.md](../benchmarks/results/fit-summary.md)``). MkDocs only knows the files
under docs/, so such a link would be left dangling (and ``--strict`` fails on it). This hook
copies every repository file that the pages link outside docs/ (and, for a linked Markdown
file, what that file links in turn: the PNG beside a result table) into the site under
``repo/``, Markdown rendered as a page, and points the links there. It reads local files only.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

PREFIX = "repo"
# [text](target) and ![alt](target); the target stops at whitespace or ')'
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
CODE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _root(config) -> Path:
    return Path(config["docs_dir"]).resolve().parent


def _outside(src_uri: str, target: str) -> str | None:
    """The repository path of ``target`` as linked from the docs page ``src_uri``, when it
    leaves docs/; None for a link inside docs/, an anchor or an external URL."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith(("#", "/")):
        return None
    path = target.split("#", 1)[0]
    if not path:
        return None
    joined = posixpath.normpath(posixpath.join("docs", posixpath.dirname(src_uri), path))
    if joined == "docs" or joined.startswith("docs/") or joined.startswith(".."):
        return None
    return joined


def _links(text: str) -> list[str]:
    return [m.group(2) for m in LINK.finditer(CODE.sub("", text))]


def on_files(files: Files, config) -> Files:
    root = _root(config)
    wanted: set[str] = set()
    pending = [
        (f.src_uri, Path(f.abs_src_path).read_text(encoding="utf-8"))
        for f in files.documentation_pages()
        if f.abs_src_path and not f.src_uri.startswith(PREFIX + "/")
    ]
    while pending:
        src_uri, text = pending.pop()
        for target in _links(text):
            if src_uri.startswith(PREFIX + "/"):  # a copied file: its links are the repository's
                path = target.split("#", 1)[0]
                if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path, re.I) or path.startswith("/"):
                    continue
                repo_path = posixpath.normpath(
                    posixpath.join(posixpath.dirname(src_uri[len(PREFIX) + 1 :]), path)
                )
            else:
                repo_path = _outside(src_uri, target)
            if repo_path is None or repo_path in wanted or repo_path.startswith(".."):
                continue
            source = root / repo_path
            if not source.is_file():
                continue  # left to MkDocs's own link check, which reports it
            wanted.add(repo_path)
            if source.suffix == ".md":
                pending.append((f"{PREFIX}/{repo_path}", source.read_text(encoding="utf-8")))
    for repo_path in sorted(wanted):
        files.append(
            File.generated(
                config,
                f"{PREFIX}/{repo_path}",
                abs_src_path=str(root / repo_path),
                inclusion=InclusionLevel.NOT_IN_NAV,
            )
        )
    return files


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    src_uri = page.file.src_uri
    if src_uri.startswith(PREFIX + "/"):
        return markdown

    def repoint(match: re.Match) -> str:
        target = match.group(2)
        repo_path = _outside(src_uri, target)
        if repo_path is None or files.get_file_from_path(f"{PREFIX}/{repo_path}") is None:
            return match.group(0)
        anchor = target[len(target.split("#", 1)[0]) :]
        new = posixpath.relpath(f"{PREFIX}/{repo_path}", posixpath.dirname(src_uri) or ".")
        return f"{match.group(1)}{new}{anchor}{match.group(3)}"

    parts = re.split(r"(^(?:```|~~~).*?^(?:```|~~~)[^\n]*$)", markdown, flags=re.S | re.M)
    return "".join(part if i % 2 else LINK.sub(repoint, part) for i, part in enumerate(parts))
