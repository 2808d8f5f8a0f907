"""Pictures: self-contained HTML pages of a container's layout (:mod:`.layout`, drawn by
:mod:`.regions`, :mod:`.compare` and :mod:`.draw`) and of a fleet job (:mod:`.matrix`).
No network, no dependency: inline SVG written by plain Python, with the CSS and a little
JavaScript kept as package data (``assets/``, read by :mod:`.resources`) and embedded in
the page."""

from __future__ import annotations

from .layout import layout_html, write_layout_html
from .matrix import matrix_data, matrix_html, write_report

__all__ = ["layout_html", "matrix_data", "matrix_html", "write_layout_html", "write_report"]
