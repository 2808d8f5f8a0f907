"""The specialization coordinator: run each backend once, lay out, patch, publish.

One module per step of the pipeline (:mod:`.pipeline` lists them in order):

- :mod:`.targets`: before any work, no destination is a source or the other one;
- :mod:`.run`: the state of one run, and :func:`~.run.read_sources`, its first step;
- :mod:`.named`: the files of a run and the merged named data map;
- :mod:`.calls`: :func:`~.calls.run_backends`, every backend id called once;
- :mod:`.session`: one backend's session, validating replacements as they arrive
  (:mod:`.buffers`: what it takes as bytes); :mod:`.session_map`: the named data map it
  hands out;
- :mod:`.spool`: the temporary file holding replacement bytes;
- :mod:`.selection`: which implementation serves which backend id, and why nothing did;
- :mod:`.aliases`: shared segments replaced consistently (users from
  :mod:`ptestore.format.users`);
- :mod:`ptestore.format.layout`: where every segment goes (pure arithmetic);
- :mod:`.digest`: the SHA-256/CRC-32 of each output, planned before it is written;
- :mod:`.output`: lay out, write every byte once, publish in order;
- :mod:`.report`: progress events and the report a run returns;
- :mod:`.pipeline`: :func:`initialize_and_save_backend_data` and :class:`RunOptions`,
  the steps in order; :mod:`.rules`: what it shares with the in-place run;
- :mod:`.pair`: :func:`specialize_pair`, the pair runner: open the loaders and writers
  of one pair of URLs, run the pipeline, discard and close;
- :mod:`.frontend`: :func:`specialize`, the URL front end (checks, then the pair runner);
- :mod:`.inplace` and :mod:`.journal_writer`: ``specialize(src, src, in_place=True)``,
  the run whose writer is a journal beside the file (:mod:`ptestore.journal`);
  :mod:`.inplace_commit`: its end, from its last check of the file to the apply;
- :mod:`.respecialize`: what a file's own trailer says about it; in place never
  specializes an output again (:class:`~ptestore.errors.AlreadySpecialized`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
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

#: Where each public name lives: imported when first asked for (PEP 562), so that a
#: run imports the steps it takes (an in-place run never imports the pipeline's layout
#: and writers; start-up is measured on devices).
_HOMES = {
    "specialize": "frontend",
    "specialize_pair": "pair",
    "RunOptions": "pipeline",
    "initialize_and_save_backend_data": "pipeline",
    "BackendReport": "report",
    "Event": "report",
    "EventTracer": "report",
    "FileReport": "report",
    "SpecializationReport": "report",
    "nothing_specialized_message": "report",
    "MAX_REQUESTED_ALIGNMENT": "session",
}


__getattr__ = lazy_names(__name__, _HOMES)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
