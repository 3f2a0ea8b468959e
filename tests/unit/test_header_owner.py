"""The ``celery_funnel`` header has one owner, ``_shared/state.py``: every field it
carries is a field of ``State`` (``lease`` and ``promised`` included), every value
written is built there, and no other module of the package reads the header raw (they
ask ``State.from_headers``, ``State.of_run``, ``carries_state``, ``put_state``,
``drop_state``)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

from celery_funnel._shared.state import FRESH, HEADER, State, admitted_by_gate, gate_mark
from celery_funnel._stores.concurrency import ConcurrencyFunnel, Lease

PACKAGE = Path(__file__).resolve().parents[2] / "celery_funnel"
OWNER = PACKAGE / "_shared" / "state.py"


def _names_the_header(path: Path) -> bool:
    """Whether a module refers to the header's name: the constant ``HEADER`` (imported
    or read), or its text as a key (``"celery_funnel"`` subscripted or got)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and any(a.name == "HEADER" for a in node.names):
            return True
        if isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name == "HEADER":
                return True
        key = None
        if isinstance(node, ast.Subscript):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and node.args
        ):
            key = node.args[0]
        if isinstance(key, ast.Constant) and key.value == HEADER:
            return True
    return False


def test_no_module_but_its_owner_reads_or_writes_the_header_raw() -> None:
    readers = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != OWNER and _names_the_header(path)
    ]
    assert readers == []


def test_the_check_sees_a_raw_read(tmp_path: Path) -> None:
    for source in (
        "from .state import HEADER\n",
        "x = headers['celery_funnel']\n",
        "x = headers.get('celery_funnel', {}).get('promised')\n",
    ):
        module = tmp_path / "m.py"
        module.write_text(source, encoding="utf-8")
        assert _names_the_header(module), source


def test_every_field_the_header_carries_is_a_field_of_state() -> None:
    """A header with every field set reads back whole: what is carried on, the lease of
    an admitted run, the seats promised to a released waiter."""
    seats = (ConcurrencyFunnel(2, "funnel:{t}", "t"), ConcurrencyFunnel(1, "funnel:{l}", "l"))
    carried = State(3, True, 1, 2, (0, 1), 4.5, 2, "tok")
    lease = Lease("id-1", "lease-token", seats)
    admitted = State.from_headers({"id": "id-1", HEADER: carried.admitted(lease, "h:1")})
    assert admitted == carried._replace(lease=lease)
    released = State.from_headers({"id": "id-1", HEADER: carried.released("tok-2", seats)})
    assert released == carried._replace(release="tok-2", promised=seats)
    assert set(State._fields) >= {"lease", "promised", "release", "deferrals"}
    assert State.from_headers({"id": "id-1", HEADER: carried.header()}) == carried


def test_what_one_delivery_carries_is_not_carried_on() -> None:
    """The lease and the promised seats belong to one delivery: published again, a run
    carries neither (nor the gate's mark)."""
    seats = (ConcurrencyFunnel(1, "funnel:{t}", "t"),)
    state = FRESH._replace(deferrals=1, lease=Lease("i", "t", seats), promised=seats)
    header = state.header()
    assert not {"lease", "promised", "gate"} & set(header)
    assert not admitted_by_gate({HEADER: header})


def test_a_run_reads_its_state_from_its_request() -> None:
    """A running task's request (a Celery ``Context``) carries the header as one of its
    attributes, or in its ``headers``."""
    header = FRESH._replace(deferrals=2).admitted(None, "h:1")
    by_attribute = SimpleNamespace(id="i", celery_funnel=header, headers=None)
    in_headers = SimpleNamespace(id="i", headers={HEADER: header})
    assert State.of_run(by_attribute).deferrals == State.of_run(in_headers).deferrals == 2
    assert State.of_run(SimpleNamespace(id="i", headers=None)) is FRESH
    assert State.of_run(None) is FRESH


def test_the_gate_marks_a_run_it_admits_in_its_request() -> None:
    """``State.admit`` writes what ``admitted`` builds: the mark alone for most runs."""
    seats = (ConcurrencyFunnel(1, "funnel:{t}", "t"),)
    for state, lease in ((FRESH, None), (FRESH, Lease("i", "t", seats)), (State(2), None)):
        request_dict: dict[str, object] = {}
        state.admit(request_dict, lease)
        assert request_dict == {HEADER: state.admitted(lease)}
        assert admitted_by_gate(request_dict)
    assert FRESH.admitted(None) == {"gate": gate_mark()}
