"""The gate's mark on a run it admitted (``state.gate_mark``), read once per process and
read again in a forked one, and a first arrival's lean header."""

from __future__ import annotations

import os
import socket
import warnings

import pytest

from celery_funnel._shared.state import FRESH, HEADER, State, admitted_by_gate, gate_mark


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_process_marks_runs_as_its_own_and_knows_its_parents() -> None:
    parent = gate_mark()
    assert parent == f"{socket.gethostname()}:{os.getpid()}"
    read, write = os.pipe()
    with warnings.catch_warnings():  # 3.12+: fork() in a process with threads (the
        warnings.simplefilter("ignore", DeprecationWarning)  # child only writes and exits)
        child = os.fork()
    if child == 0:  # the child: its own mark, and its parent's runs are its own too
        ok = gate_mark() == f"{socket.gethostname()}:{os.getpid()}" != parent
        ok = ok and admitted_by_gate({HEADER: {"gate": parent}})
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(child, 0)
    assert answer == b"1"
    assert gate_mark() == parent


def test_a_first_arrivals_header_is_the_mark_alone_and_reads_back_fresh() -> None:
    header = FRESH.admitted(None)
    assert header == {"gate": gate_mark()}
    assert State.from_headers({HEADER: header}) == FRESH
    assert admitted_by_gate({HEADER: header})
    waited = FRESH._replace(deferrals=1)
    assert State.from_headers({HEADER: waited.admitted(None, "x")}) == waited
