"""Deciding one run: the header a task carries between deliveries, the charges of a
run, ``judge``, and what the worker gate does with a refused run (hold it, park it,
publish it again, wait for a concurrency slot or a fair-share turn)."""
