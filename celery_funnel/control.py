"""Operate funnels live: override a funnel's limit, pause it, resume it, from Python (the
``celery funnel set|pause|resume|unset`` commands and the dashboard call these).

Overrides live in the funnels' Redis (``<prefix>{~live}#overrides``, a hash: funnel
name -> JSON); every worker reads them with its live thread about twice a second and
applies them to its next decisions, without a restart and without an extra round trip
per task. ``NAME`` is a funnel as ``celery funnel status`` names it: a FunnelTask's
task name, or ``limit:<pattern>`` for a worker-wide ``funnel_limits`` entry::

    from celery_funnel import control
    control.set_override(app, "emails.send", "20/s", ttl=3600)
    control.pause(app, "emails.send")
    control.resume(app, "emails.send")
    control.unset(app, "emails.send")      # back to the limit in the code

A changed rate or capacity applies to the next decision: as each worker takes it up,
the GCRA funnels' bookings made under the old limit are dropped and a backlog past the
new limit's tolerance is cut to it (``rebase``), and the tasks waiting for the funnel
(held in the workers, or parked) decide again at once. So a raised rate is not stuck
behind slots booked at the old pace, and a lowered one lets no burst through. A pause
ends (resume, unset, or its ``ttl``) the same way: its parked tasks are released.

``adaptive_rates(app)`` lists the adaptive funnels running below their code's rate.
"""

from ._ops.control import (
    Override,
    adaptive_rates,
    funnel_names,
    overrides,
    pause,
    resume,
    set_override,
    unset,
)

__all__ = [
    "Override", "adaptive_rates", "funnel_names", "overrides", "pause", "resume", "set_override",
    "unset",
]  # fmt: skip
