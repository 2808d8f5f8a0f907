"""The specialization coordinator: run each backend once, lay out, patch, publish.

One module per step of the pipeline (:mod:`.pipeline` reads as the list):

- :mod:`.report`: progress events and the report a run returns;
- :mod:`.spool`: the temporary file holding replacement bytes;
- :mod:`.named`: the files of a run and the merged named data map;
- :mod:`.session`: one backend's session, validating replacements as they arrive;
- :mod:`.selection`: which implementation serves which backend id;
- :mod:`.aliases`: shared segments replaced consistently;
- :mod:`ptestore.format.layout`: where every segment goes (pure arithmetic);
- :mod:`.output`: write every byte once, publish in order;
- :mod:`.pipeline`: :func:`initialize_and_save_backend_data`, the steps in order;
- :mod:`.pair`: :func:`specialize_pair`, the pair runner: open the loaders and writers
  of one pair of URLs, run the pipeline, discard and close;
- :mod:`.frontend`: :func:`specialize`, the URL front end (checks, then the pair runner).
"""

from __future__ import annotations

from .frontend import specialize
from .pair import specialize_pair
from .pipeline import RunOptions, initialize_and_save_backend_data
from .report import (
    BackendReport,
    Event,
    EventTracer,
    FileReport,
    SpecializationReport,
    nothing_specialized_message,
)
from .session import MAX_REQUESTED_ALIGNMENT

__all__ = [
    "MAX_REQUESTED_ALIGNMENT",
    "BackendReport",
    "Event",
    "EventTracer",
    "FileReport",
    "RunOptions",
    "SpecializationReport",
    "initialize_and_save_backend_data",
    "nothing_specialized_message",
    "specialize",
    "specialize_pair",
]
