"""mkdocs hook: a ``\\|`` in a table row becomes ``|`` before the page is rendered.

GitHub needs a pipe inside a table cell escaped, even inside a code span (``\\|``), or it splits the cell;
Python-Markdown's tables already keep a pipe inside a code span whole, but show the backslash. The pages
are written for GitHub, and this makes the site show the same cells.
"""

from __future__ import annotations

from typing import Any


def on_page_markdown(markdown: str, **_: Any) -> str:
    return "\n".join(
        line.replace("\\|", "|") if line.lstrip().startswith("|") else line for line in markdown.split("\n")
    )
