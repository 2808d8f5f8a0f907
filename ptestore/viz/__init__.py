"""Pictures: self-contained HTML pages of a container's layout (:mod:`.layout`) and of a
fleet job (:mod:`.matrix`). No network, no dependency: inline SVG, CSS and a little
JavaScript, written by plain Python."""

from __future__ import annotations

from .layout import layout_html, write_layout_html
from .matrix import matrix_data, matrix_html, write_report

__all__ = ["layout_html", "matrix_data", "matrix_html", "write_layout_html", "write_report"]
