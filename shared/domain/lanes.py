"""A call's lane: ``live`` (the default: a client waits on it) or ``bulk`` (a batch job's lines, below every live call).

The lane rides on the call from the gateway (the ``X-Poolgate-Lane`` header,
``gateway.serving``) through the transport (``shared.wire.token_call``) to the
worker's queued sequences. Everywhere a decision could let work wait or refuse
it, bulk comes after live: the gateway's admission (``gateway.pools.admission``)
counts no bulk work against a live job, the worker's queue bound
(``workers.engine.scheduler``) counts none against a live call, and its batch
policies (``workers.engine.policy``, ``workers.engine.fair_policy``) give bulk
only the budget live work leaves. ``priority`` still orders calls within a lane.
"""

from typing import Literal, get_args

Lane = Literal["live", "bulk"]
LANES: tuple[Lane, ...] = get_args(Lane)
LIVE: Lane = "live"
BULK: Lane = "bulk"


def lane_of(value: object) -> Lane:
    """``value`` as a lane (None = live); ValueError for anything else."""
    if value is None:
        return LIVE
    for lane in LANES:
        if value == lane:
            return lane
    raise ValueError(f"unknown lane {value!r}; expected one of {', '.join(LANES)}")
