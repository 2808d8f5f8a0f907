"""Fleet pre-specialization: every (model, device) pair of a job, once, verifiably.

- :mod:`.job`: the TOML job file (:func:`load_job`, :class:`Job`);
- :mod:`.plan`: what a run would do, pair by pair (:func:`plan_job`);
- :mod:`.work`: one pair, create-or-verify (:func:`run_pair`);
- :mod:`.runner`: inline, process pool or Dask distributed (:func:`run_job`).

See docs/fleet.md.
"""

from __future__ import annotations

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
