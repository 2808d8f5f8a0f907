"""The two old import paths (``ptestore.loaders``, ``ptestore.writers.gc``) still give
every name they gave, the very same objects, each with a DeprecationWarning that names the
new home; nothing inside ptestore imports them (``test_house_imports.py``)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import ptestore.gc
import ptestore.storage.loaders

OLD_PATHS = [
    ("ptestore.loaders", ptestore.storage.loaders, "ptestore.storage.loaders"),
    ("ptestore.writers.gc", ptestore.gc, "ptestore.gc"),
]


@pytest.mark.parametrize(("old", "new", "new_name"), OLD_PATHS)
def test_every_old_name_is_the_new_object_with_a_warning(
    old: str, new: object, new_name: str
) -> None:
    module = importlib.import_module(old)
    assert module.__all__  # type: ignore[attr-defined]
    for name in module.__all__:  # type: ignore[attr-defined]
        with pytest.warns(DeprecationWarning, match=f"^{old} is deprecated") as caught:
            value = getattr(module, name)
        assert value is getattr(new, name), name
        assert [str(w.message) for w in caught] == [
            f"{old} is deprecated: import {name} from {new_name}"
        ]
        # attributed to the caller (this file), not to the alias module
        assert caught[0].filename == __file__


@pytest.mark.parametrize(("old", "new", "new_name"), OLD_PATHS)
def test_a_name_the_old_path_never_had_is_an_attribute_error(
    old: str, new: object, new_name: str
) -> None:
    module = importlib.import_module(old)
    with pytest.raises(AttributeError, match=rf"^module '{old}' has no attribute 'nope'$"):
        module.nope  # noqa: B018


def test_from_import_warns_in_a_fresh_interpreter() -> None:
    """``from ptestore.loaders import open_loader`` (what a user's code says) warns once
    per name, at the user's line, and importing the old module alone does not warn."""
    code = (
        "import warnings\n"
        "warnings.simplefilter('error')\n"
        "import ptestore.loaders, ptestore.writers.gc\n"  # line 3: no warning
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    from ptestore.loaders import open_loader\n"  # line 6
        "    from ptestore.writers.gc import collect_local\n"  # line 7
        "print([(str(x.message), x.lineno) for x in w])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str(
        [
            ("ptestore.loaders is deprecated: import open_loader from ptestore.storage.loaders", 6),
            ("ptestore.writers.gc is deprecated: import collect_local from ptestore.gc", 7),
        ]
    )
