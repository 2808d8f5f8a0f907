"""Fleet pre-specialization: every (model, device) pair of a job, once, verifiably.

- :mod:`.job`: the TOML job file (:func:`load_job`, :class:`Job`);
- :mod:`.plan`: what a run would do, pair by pair (:func:`plan_job`);
- :mod:`.work`: one pair, create-or-verify (:func:`run_pair`);
- :mod:`.runner`: inline, process pool or Dask distributed (:func:`run_job`).

See docs/fleet.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .job import Job, JobError, Model, Pair, load_job, parse_job
    from .plan import Plan, PlannedPair, plan_job
    from .runner import SCHEDULER_ENV, FleetResult, run_job, run_plan
    from .work import PairResult, PairTask, run_pair


__all__ = [
    "SCHEDULER_ENV",
    "FleetResult",
    "Job",
    "JobError",
    "Model",
    "Pair",
    "PairResult",
    "PairTask",
    "Plan",
    "PlannedPair",
    "load_job",
    "parse_job",
    "plan_job",
    "run_job",
    "run_pair",
    "run_plan",
]

#: Every public name imported on first use (PEP 562): importing the package takes
#: none of its submodules' import locks, so two threads' first imports of the
#: package and of one of its submodules cannot deadlock (:mod:`ptestore._lazy`).
_LAZY = {
    "Job": "job",
    "JobError": "job",
    "Model": "job",
    "Pair": "job",
    "load_job": "job",
    "parse_job": "job",
    "Plan": "plan",
    "PlannedPair": "plan",
    "plan_job": "plan",
    "SCHEDULER_ENV": "runner",
    "FleetResult": "runner",
    "run_job": "runner",
    "run_plan": "runner",
    "PairResult": "work",
    "PairTask": "work",
    "run_pair": "work",
}

__getattr__ = lazy_names(__name__, _LAZY)
