"""Fault campaigns: one data flow of real waymark processes under a seeded random
schedule of faults, checked at the end and reported (docs/faults.md).

One module per concept: ``schedule`` (what fault when), ``proxy`` (the fault-injecting
TCP proxy), ``processes`` (the processes under test), ``spark`` (the Spark query of
``--spark``), ``checkers`` (the verdicts), ``report`` (JSON and HTML) and ``campaign``
(the run that ties them together).
"""

from waymark.faults.campaign import CampaignResult, run_campaign
from waymark.faults.checkers import CheckResult
from waymark.faults.schedule import Fault, FaultKind, make_schedule

__all__ = ["CampaignResult", "CheckResult", "Fault", "FaultKind", "make_schedule", "run_campaign"]
