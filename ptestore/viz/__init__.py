"""Pictures: self-contained HTML pages of a container's layout (:mod:`.layout`, drawn by
:mod:`.regions`, :mod:`.compare` and :mod:`.draw`) and of a fleet job (:mod:`.matrix`).
No network, no dependency: inline SVG written by plain Python, with the CSS and a little
JavaScript kept as package data (``assets/``, read by :mod:`.resources`) and embedded in
the page."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .layout import layout_html, write_layout_html
    from .matrix import matrix_data, matrix_html, write_report


__all__ = ["layout_html", "matrix_data", "matrix_html", "write_layout_html", "write_report"]

#: Every public name imported on first use (PEP 562): importing the package takes
#: none of its submodules' import locks, so two threads' first imports of the
#: package and of one of its submodules cannot deadlock (:mod:`ptestore._lazy`).
_LAZY = {
    "layout_html": "layout",
    "write_layout_html": "layout",
    "matrix_data": "matrix",
    "matrix_html": "matrix",
    "write_report": "matrix",
}

__getattr__ = lazy_names(__name__, _LAZY)
