"""The follower daemon a party or an aggregator runs beside the controller.

:class:`Agent` (:mod:`confide.agent.follower`) registers with the controller, syncs every few
seconds, applies configuration deltas (:mod:`confide.agent.config`) and runs what the controller
says through a :class:`Worker`: the party's (:mod:`confide.party.agent`) or the aggregator's
(:mod:`confide.aggregator.agent`). :class:`ControllerClient` (:mod:`confide.agent.client`) is the
controller's REST client, which the CLI uses too. Both roles import this package; it imports no
role and not the controller's server side.
"""

from confide.agent.client import ControllerClient
from confide.agent.follower import METRICS_PER_REPORT, Agent, RunState, Worker, runtime_job_id

__all__ = ["METRICS_PER_REPORT", "Agent", "ControllerClient", "RunState", "Worker", "runtime_job_id"]
