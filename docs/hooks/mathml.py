r"""MkDocs hook: render the pages' LaTeX as MathML when the site is built.

``pymdownx.arithmatex`` (generic mode) wraps inline math as
``<span class="arithmatex">\(...\)</span>`` and display math as
``<div class="arithmatex">\[...\]</div>``. This hook replaces each with the
MathML that ``latex2mathml`` produces, so the site shows formulas with no
script and nothing fetched, at build time or when a page is read. A formula
that does not convert stops the build with the page and the formula.

The docstrings use Sphinx roles (``:class:`~dpfl.x.Y```), which the numpy
docstring renderer leaves as text; the hook shows them as plain code (``Y``,
or the full path without ``~``).
"""

from __future__ import annotations

import html
import re
from typing import Any

from latex2mathml.converter import convert

_INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
_DISPLAY = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)
_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):<code>(~?)([^<]*)</code>"
)


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if match.group(1) else target}</code>"


def _mathml(latex: str, display: str, where: str) -> str:
    source = html.unescape(latex).strip()
    try:
        return convert(source, display=display)
    except Exception as exc:  # latex2mathml raises several exception types
        raise ValueError(
            f"{where}: cannot render the formula {source!r}: {exc}"
        ) from exc


def on_page_content(html_text: str, page: Any, **_: Any) -> str:
    """Replace one page's arithmatex wrappers by MathML, and its roles by code."""
    where = page.file.src_uri
    html_text = _DISPLAY.sub(
        lambda m: (
            '<div class="math-display">'
            + _mathml(m.group(1), "block", where)
            + "</div>"
        ),
        html_text,
    )
    html_text = _INLINE.sub(lambda m: _mathml(m.group(1), "inline", where), html_text)
    return _ROLE.sub(_role, html_text)
