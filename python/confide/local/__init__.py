"""Everything on one machine, as separate processes: the one launcher and what it starts.

* :class:`LocalFederation` / :func:`run_local` (``confide run``): an aggregator (or a cluster)
  and one party process per party, then the job report;
* :class:`LocalDeployment`: controller, aggregator and party agents (``make demo``, tests);
* :class:`Cluster` (``confide cluster``): N aggregator processes.

All three start their children through :class:`Processes` (``processes.py``): one way to spawn
``python -m confide ...`` with a log, wait for its port file, and stop it.
"""

from confide.local.cluster import Cluster
from confide.local.deployment import LocalDeployment
from confide.local.federation import LocalFederation, build_report, centralized_baseline, run_local, write_report
from confide.local.processes import Processes

__all__ = [
    "Cluster",
    "LocalDeployment",
    "LocalFederation",
    "Processes",
    "build_report",
    "centralized_baseline",
    "run_local",
    "write_report",
]
