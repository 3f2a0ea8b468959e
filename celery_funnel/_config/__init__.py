"""Settings and task options (read and checked from ``app.conf`` and the tasks), and
the per-app ``Runtime`` that holds them with the funnel backend, the countdown policy,
the outage log and the observer."""
