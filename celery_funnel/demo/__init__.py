"""``celery-funnel demo``: real Celery workers share one funnel on a private Redis."""

from ._run import run

__all__ = ["run"]
