"""Deciding one message: the worker gate (``gate``) and what it does with a refused run
(hold it, park it, publish it again, wait for a concurrency seat or a fair-share turn),
built on what it shares with the worker's services (``_shared``)."""
