"""Griffe extension for the API pages: a docstring's ``Example:`` section is read as
``Examples:``.

In Google style griffe reads ``Examples:`` as doctest (``>>>`` lines become code blocks) but
``Example:`` as a plain admonition, whose ``>>>`` lines Markdown then parses as text (a
``[...]`` output line reads as a link). rm_qdrant's docstrings write ``Example:``; this
changes only how the site renders them, not the code. Sphinx roles (``:func:`merge```) are
shown as code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

SECTION = re.compile(r"^(\s*)Example:[ \t]*$", re.M)
# Sphinx roles (:func:`x`, :meth:`~a.b`) shown as code, as they read in the source
ROLE = re.compile(r":(?:func|meth|class|mod|attr|data|exc|obj):`~?([^`]+)`")


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            value = SECTION.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = ROLE.sub(r"`\1`", value)
