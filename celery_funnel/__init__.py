"""celery-funnel: a shared Redis funnel (GCRA leaky bucket) for Celery tasks.

The core: ``Rate`` parses limits, a ``Funnel`` backend (``RedisFunnel`` or
``MemoryFunnel``) takes units atomically and answers with a ``Decision`` (``throttle``
and the window strategies) or a ``Reservation`` (``reserve``).
"""

from ._decision import Decision, Reservation
from ._errors import (
    BackendConfigurationError,
    BackendError,
    ConfigurationError,
    CostTooHighError,
    FunnelError,
    TooManyDeferralsError,
)
from ._install import install
from ._limit import Limit
from ._rate import Rate
from .backends.base import Funnel
from .backends.memory import MemoryFunnel
from .backends.redis import RedisFunnel
from .strategies.reservation import Shape
from .task import FunnelTask

__all__ = [
    "BackendConfigurationError",
    "BackendError",
    "ConfigurationError",
    "CostTooHighError",
    "Decision",
    "Funnel",
    "FunnelError",
    "FunnelTask",
    "Limit",
    "MemoryFunnel",
    "Rate",
    "RedisFunnel",
    "Reservation",
    "Shape",
    "TooManyDeferralsError",
    "install",
]

__version__ = "0.1.0"
