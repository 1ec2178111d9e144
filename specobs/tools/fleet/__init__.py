"""``specobs fleet-sim``: a fleet of simulated servers on one loopback port, with faults on a
schedule, for the generated dashboards and alert rules to be tried on a real Prometheus, and
``--score`` to say which alerts fired for which fault.

:mod:`._sim` is the fleet, :mod:`._schedule` the fault schedule, :mod:`._score` the scoring and
:mod:`._command` the command line.
"""

from specobs.tools.fleet._command import add_arguments, run

__all__ = ["add_arguments", "run"]
