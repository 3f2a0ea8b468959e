"""The limiter core: rates, limits, decisions, the key layout, the strategies with
their Lua scripts and Python twins, and the backends that run one atomic script call per decision.
No Celery import: everything above builds on this."""
