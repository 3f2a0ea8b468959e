"""The fault matrix: celery-funnel under real faults, counted from the tasks' own records.

- ``proxy``: a loopback TCP proxy that partitions the network (``cut``/``heal``);
- ``proj``: the Celery project the workers run (``celery -A tests.faults.proj worker``);
- ``workers``: the workers under a supervisor (kill and replace; exits counted);
- ``load``: CPU burners, for faults that show only on a loaded machine;
- ``cases``: each case, a workload and a timed fault;
- ``rig`` and ``runner``: the servers of a run, and one run of a case;
- ``matrix``: every case N times and a table (``python3 dev.py faults``).

``tests/integration/test_fault_matrix.py`` runs the CI subset, each case once.
"""
