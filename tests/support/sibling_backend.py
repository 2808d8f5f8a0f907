"""A backend that stands in for another worker's pair running at the same time, for the
destination-root tests of an inline fleet run (``support.sibling_backend:Sibling``; one
process, so the order is the test's, never the scheduler's):

- for device ``a``: open a local writer (``auto_mkdir``, as a pair's) for
  ``<destination root>/b/sibling.pte``, as a pair of device ``b`` on another worker
  would, keep it open, then fail: the pair's own writers discard while it is open;
- for device ``b``: discard that writer, then fail.
"""

from __future__ import annotations

import os
from typing import Any

from ptestore.backends import BackendInterface
from ptestore.writers import LocalFileWriter

#: The writer device ``a`` opened, discarded by device ``b``.
OPEN: list[LocalFileWriter] = []


class Sibling(BackendInterface):
    name = "*"
    version = "1"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        root = context.device.options["root"]
        if context.device.name == "a":
            w = LocalFileWriter(os.path.join(root, "b", "sibling.pte"), auto_mkdir=True)
            w.write(b"the other worker's output", 0)
            OPEN.append(w)
            raise RuntimeError("pair a fails while the other worker's writer is open")
        OPEN.pop().discard()
        raise RuntimeError("pair b fails after the other worker's writer was discarded")
