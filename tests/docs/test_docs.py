"""The documentation: the MkDocs site builds offline with --strict, the README stays short, and
every relative link in README.md and docs/ points to a file that exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 200

# [text](target), ![alt](target), and reference definitions "[id]: target"
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ...


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    """The relative link targets of a Markdown text, code blocks and code spans left out."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    targets = INLINE.findall(prose) + DEFINITION.findall(prose)
    return [t for t in targets if not EXTERNAL.match(t) and not t.startswith(("#", "/"))]


def test_relative_links_finds_links_and_skips_code():
    text = (
        "See [a](a.md#x), ![img](p/i.png), [ext](https://x.org/y.md), [top](#here).\n"
        "`[not](code.md)`\n```\n[not](fence.md)\n```\n[ref]: b.md\n"
    )
    assert relative_links(text) == ["a.md#x", "p/i.png", "b.md"]


@pytest.mark.slow
def test_site_builds_strict_offline(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, a page missing from the nav, an API
    name griffe cannot resolve or a docstring it cannot render fails the build."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.monotonic() - start
    assert result.returncode == 0, f"mkdocs build failed after {seconds:.1f} s:\n{result.stderr}"
    site = tmp_path / "site"
    assert (site / "index.html").is_file()
    cli_page = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "rmq migrate" in cli_page and "--until" in cli_page  # generated from the click commands
    api_page = (site / "reference" / "python" / "index.html").read_text(encoding="utf-8")
    assert 'id="rm_qdrant.DualIndex"' in api_page  # generated from the docstrings
    print(f"mkdocs build --strict: {seconds:.1f} s")


def test_api_page_names_only_top_level_names():
    """The API page documents rm_qdrant's public names by their top-level path only: modules
    inside the package move, and a page naming one would break with them."""
    import rm_qdrant

    page = (DOCS / "reference" / "python.md").read_text(encoding="utf-8")
    named = re.findall(r"^::: (\S+)", page, re.M)
    assert sorted(named) == sorted(f"rm_qdrant.{name}" for name in rm_qdrant.__all__)


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files(path):
    broken = []
    for target in relative_links(path.read_text(encoding="utf-8")):
        file = unquote(target.split("#", 1)[0].split("?", 1)[0])
        if not (path.parent / file).resolve().is_file():
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)} links to missing files: {broken}"
