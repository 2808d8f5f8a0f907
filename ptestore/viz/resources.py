"""The pages' script and style, kept as package data (``ptestore/viz/assets/``) and
read on first use: a page embeds them inline, so it stays one self-contained file."""

from __future__ import annotations

import functools

__all__ = ["asset"]


@functools.cache
def asset(name: str) -> str:
    """The text of ``assets/<name>`` (``layout.js``, ``matrix.css``, ...)."""
    from importlib.resources import files

    return files("ptestore.viz").joinpath("assets").joinpath(name).read_text(encoding="utf-8")
