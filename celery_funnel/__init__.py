"""celery-funnel: a shared Redis funnel (GCRA leaky bucket) for Celery tasks.

The core: ``Rate`` parses limits, a ``Funnel`` backend (``RedisFunnel`` or
``MemoryFunnel``; ``AsyncRedisFunnel`` for asyncio) takes units atomically and answers
with a ``Decision`` (``throttle`` and the window strategies) or a ``Reservation``
(``reserve``). ``funnel.limit("5/s")`` puts any function or block behind a funnel.
"""

from ._celery.task import FunnelTask
from ._install import install
from ._limiter.backends.base import Funnel
from ._limiter.backends.memory import MemoryFunnel
from ._limiter.backends.redis import RedisFunnel
from ._limiter.backends.redis_async import AsyncRedisFunnel
from ._limiter.decision import Decision, Reservation
from ._limiter.errors import (
    BackendConfigurationError,
    BackendError,
    ConfigurationError,
    CostTooHighError,
    FunnelError,
    Limited,
    TooManyDeferralsError,
    TooManyWaitingError,
)
from ._limiter.guard import LimitGuard
from ._limiter.headers import Quota, Upstream, read_headers
from ._limiter.limit import Limit
from ._limiter.rate import Rate
from ._limiter.strategies.align import Align
from ._limiter.strategies.reservation import Shape
from ._limiter.strategies.settle import Settle

__all__ = [
    "Align",
    "AsyncRedisFunnel",
    "BackendConfigurationError",
    "BackendError",
    "ConfigurationError",
    "CostTooHighError",
    "Decision",
    "Funnel",
    "FunnelError",
    "FunnelTask",
    "Limit",
    "LimitGuard",
    "Limited",
    "MemoryFunnel",
    "Quota",
    "Rate",
    "RedisFunnel",
    "Reservation",
    "Settle",
    "Shape",
    "TooManyDeferralsError",
    "TooManyWaitingError",
    "Upstream",
    "install",
    "read_headers",
]

__version__ = "0.1.0"
