"""The command lines: ``celery -A proj funnel ...`` (``commands``) and the
``celery-funnel`` script (``main``)."""
