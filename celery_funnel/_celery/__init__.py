"""The Celery adapters: ``FunnelTask``, the worker gate's bootstep, the releaser's
bootstep and the start checks."""
