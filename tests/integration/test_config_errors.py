"""Mistakes that used to be silent, each caught before a task runs with a
``ConfigurationError`` that names the task, the option and the value: at the
``@app.task`` line when an app module is imported, at the call for key values, or when
a real worker starts (in-process, or a ``celery worker`` process where the start path
differs)."""

from __future__ import annotations

import importlib.util
import itertools
import os
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_funnel import ConfigurationError, FunnelTask, install
from celery_funnel._config.runtime import runtime_for
from celery_funnel.testing import CeleryWorkers
from tests.integration.conftest import Recorder
from tests.polling import wait_for

HERE = Path(__file__)
_modules = itertools.count()


# --- at import: the error is raised from the @app.task line of the user's module ---

APP_MODULE = """\
from celery import Celery

from celery_funnel import FunnelTask, install

app = install(Celery("{name}", broker="memory://"))


@app.task({options}, shared=False)
def send(customer, n=0):
    return n
"""


def import_app(tmp_path: Path, options: str, *, source: str = APP_MODULE) -> Any:
    """Import a new app module whose task is ``@app.task(<options>)``."""
    name = f"cfg_app_{next(_modules)}"
    path = tmp_path / f"{name}.py"
    path.write_text(source.format(name=name, options=options))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def raised_at(error: BaseException, path: Path) -> str:
    """The source line of the last frame of ``path`` in ``error``'s traceback."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(path)]
    assert frames, f"no frame of {path} in the traceback"
    return (frames[-1].line or "").strip()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ('funnel_rate="5/s"', [
            "task '{module}.send': funnel_rate='5/s' given, but the task is not a FunnelTask",
            "add base=FunnelTask",
        ]),
        ('base=FunnelTask, funnel_rates="5/s"', [
            "funnel_rates='5/s' is not a FunnelTask option (did you mean 'funnel_rate'?)",
        ]),
        ('base=FunnelTask, funnel_rate="5/s", funnel_capcity=3', [
            "funnel_capcity=3 is not a FunnelTask option (did you mean 'funnel_capacity'?)",
        ]),
        ('base=FunnelTask, funnel_rate="5/s", funnel_key="{missing}"', [
            "funnel_key='{missing}' names 'missing', which is not a parameter of the task",
            "its parameters are ['customer', 'n']",
        ]),
        ('base=FunnelTask, funnel_rate="5/s", funnel_key="{custmer}"', [
            "(did you mean 'customer'?)",
        ]),
        ('base=FunnelTask, funnel_rate="5/s", funnel_limits=[{"rate": "9/m", "key": "{r}"}]',
         ["funnel_limits[0]['key']='{r}' names 'r'"]),
        ('base=FunnelTask, funnel_rate="5/s", funnel_capacity=10**12', [
            "funnel_capacity must be an integer from 1 to 1_000_000, got 1000000000000",
        ]),
        ('base=FunnelTask, funnel_rate="5/s", funnel_dry_run="nope"', [
            "funnel_dry_run must be a boolean", "got 'nope'",
        ]),
        ('base=FunnelTask, funnel_rate="5/s", funnel_strategy="sliding-log"', [
            "funnel_strategy must be one of", "(did you mean 'sliding_log'?)",
        ]),
        ('base=FunnelTask, funnel_rate="2000000/s"', ["faster than one unit per microsecond"]),
    ],
)  # fmt: skip
def test_mistakes_in_task_options_fail_at_the_decorator_line(
    tmp_path: Path, options: str, named: list[str]
) -> None:
    with pytest.raises(ConfigurationError) as info:
        import_app(tmp_path, options)
    path = next(tmp_path.glob("cfg_app_*.py"))
    message = str(info.value)
    for text in named:
        assert text.replace("{module}", path.stem) in message
    assert raised_at(info.value, path) == f"@app.task({options}, shared=False)"
    # only one frame of the package after the user's line: the check itself
    frames = traceback.extract_tb(info.value.__traceback__)
    assert [f.filename for f in frames].index(str(path)) >= len(frames) - 3


def test_booleans_in_celerys_spelling_are_read_as_meant(tmp_path: Path) -> None:
    module = import_app(tmp_path, 'base=FunnelTask, funnel_rate="5/s", funnel_dry_run="false"')
    from celery_funnel._config.options import dry_run_of

    assert dry_run_of(module.app.tasks[f"{module.__name__}.send"], True) is False


FINALIZED_MODULE = """\
from celery import Celery

from celery_funnel import FunnelTask

app = Celery("{name}", broker="memory://")
app.finalize()  # tasks are made at the decorator call: no install() needed to check them


@app.task({options}, shared=False)
def send(customer, n=0):
    return n
"""


def test_funnel_task_classes_fail_where_made_without_install(tmp_path: Path) -> None:
    options = 'base=FunnelTask, funnel_rate="5/s", funnel_key="{missing}"'
    with pytest.raises(ConfigurationError, match="names 'missing'") as info:
        import_app(tmp_path, options, source=FINALIZED_MODULE)
    path = next(tmp_path.glob("cfg_app_*.py"))
    assert raised_at(info.value, path) == f"@app.task({options}, shared=False)"


# --- at the call: key values whose str() is not stable ---


class Customer:
    """An object whose str() holds its address: one funnel per task if it were a key."""

    id = "c-7"


@pytest.fixture
def keyed_app(standalone_url: str) -> Iterator[Celery]:
    app = install(
        Celery("cfg", broker=standalone_url, backend=standalone_url.rsplit("/", 1)[0] + "/1")
    )
    app.conf.update(
        funnel_redis_url=standalone_url,
        task_serializer="pickle",
        result_serializer="pickle",
        accept_content=["pickle", "json"],
        worker_hijack_root_logger=False,
    )

    @app.task(
        name="cfg.send", shared=False, base=FunnelTask, funnel_rate="50/s", funnel_key="{customer}"
    )
    def send(customer: Any, n: int = 0) -> int:
        return n

    @app.task(
        name="cfg.by_id",
        shared=False,
        base=FunnelTask,
        funnel_rate="50/s",
        funnel_key="{customer.id}",
    )
    def by_id(customer: Any, n: int = 0) -> int:
        return n

    yield app
    runtime_for(app).close()
    app.close()


@pytest.mark.redis
@pytest.mark.parametrize(
    "call",
    [
        lambda task, value: task.delay(value),
        lambda task, value: task.apply_async(kwargs={"customer": value}),
        lambda task, value: task.s(value, n=2).delay(),
    ],
    ids=["delay", "apply_async", "signature"],
)
def test_unstable_key_values_fail_at_the_call(
    keyed_app: Celery, call: Callable[[Any, Any], Any]
) -> None:
    value = Customer()
    with pytest.raises(ConfigurationError) as info:
        call(keyed_app.tasks["cfg.send"], value)
    message = str(info.value)
    assert f"task 'cfg.send': funnel_key: customer={value!r} (Customer)" in message
    assert "cannot be part of a funnel key" in message
    assert "0x" in message  # the address that would have made one funnel per task


@pytest.mark.redis
def test_unstable_key_values_fail_the_task_in_the_gate(keyed_app: Celery) -> None:
    """Sent around the call's check (``send_task``): the worker fails the task with the
    same clear error, and runs the ones keyed on plain data."""
    with start_worker(keyed_app, pool="threads", concurrency=2, perform_ping_check=False):
        bad = keyed_app.send_task("cfg.send", args=[Customer()])
        with pytest.raises(ConfigurationError, match="cannot be part of a funnel key"):
            bad.get(timeout=20)
        assert keyed_app.tasks["cfg.send"].delay({"id": 7}, n=1).get(timeout=20) == 1
        assert keyed_app.tasks["cfg.by_id"].delay(Customer(), n=2).get(timeout=20) == 2


# --- at worker start (in-process workers: the consumer's bootstep checks) ---


def make_app(url: str, **conf: Any) -> Celery:
    """An app with one FunnelTask and one plain task, both defined before install(), as
    with tasks from other modules: only the worker-start check sees them."""
    app = Celery("cfg", broker=url)
    app.conf.update(worker_hijack_root_logger=False, **conf)

    @app.task(
        name="cfg.send", shared=False, base=FunnelTask, funnel_rate="5/s", funnel_key="{customer}"
    )
    def send(customer: str, n: int = 0) -> int:
        return n

    @app.task(name="cfg.plain", shared=False)
    def plain(n: int = 0) -> int:
        return n

    @app.task(name="cfg.bare", shared=False, base=FunnelTask)  # limits may come by annotation
    def bare(n: int = 0) -> int:
        return n

    return install(app)


def refused_start(tmp_path: Path, module: str, source: str, broker_url: str) -> tuple[int, str]:
    """A real ``celery worker`` of app module ``module`` (``source``, written to
    ``tmp_path``) that is expected to stop at start: its exit status and its logs."""
    (tmp_path / f"{module}.py").write_text(source)
    workers = CeleryWorkers(
        module, 1, {"CFG_BROKER": broker_url}, "--pool", "solo", cwd=str(tmp_path)
    ).start()
    try:
        wait_for(lambda: workers.processes[0].poll() is not None, timeout=60)
        logs = workers.logs()
    finally:
        workers.stop()
    code = workers.processes[0].returncode
    return (1 if code is None else code), logs


def worker_start_error(app: Celery) -> str:
    """The message of the ConfigurationError that stops a worker of ``app`` at start."""
    try:
        with pytest.raises(ConfigurationError) as info:  # noqa: SIM117 - the error is the point
            with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=5):
                pass
    finally:
        runtime_for(app).close()
        app.close()
    return str(info.value)


@pytest.mark.redis
@pytest.mark.parametrize(
    ("conf", "named"),
    [
        ({"funnel_limit": {"cfg.*": "5/s"}}, [
            "app.conf.funnel_limit={'cfg.*': '5/s'} is not a celery-funnel setting",
            "(did you mean 'funnel_limits'?)",
        ]),
        ({"task_annotations": {"cfg.send": {"funnel_rates": "9/s"}}}, [
            "task 'cfg.send' (defined at {here}:", "funnel_rates='9/s' is not a FunnelTask option",
            "(did you mean 'funnel_rate'?)",
        ]),
        ({"task_annotations": {"cfg.send": {"funnel_capcity": 3}}}, [
            "funnel_capcity=3", "(did you mean 'funnel_capacity'?)",
        ]),
        ({"task_annotations": {"cfg.plain": {"funnel_rate": "9/s"}}}, [
            "task 'cfg.plain' (defined at {here}:",
            "funnel_rate='9/s' given, but the task is not a FunnelTask",
        ]),
        ({"task_annotations": {"cfg.send": {"funnel_key": "{region}"}}}, [
            "task 'cfg.send'", "funnel_key='{region}' names 'region', which is not a parameter",
        ]),
        ({"task_annotations": {"cfg.bare": {"funnel_capacity": 5}}}, [
            "task 'cfg.bare' (defined at {here}:",
            "funnel_capacity=5 has no effect without funnel_rate",
        ]),
        ({"funnel_dry_run": "nope"}, ["funnel_dry_run must be a boolean", "got 'nope'"]),
        ({"funnel_reservation": "disabled"}, ["funnel_reservation must be a boolean"]),
        ({"funnel_max_countdown": 1e-9}, [
            "funnel_max_countdown must be a number of seconds from 0.05 to 86400, got 1e-09",
        ]),
        ({"funnel_socket_timeout": 1e12}, [
            "funnel_socket_timeout must be a number of seconds from 0.01 to 300",
        ]),
        ({"funnel_limits": {"cfg.*": {"rate": "5/s", "key": "{customer}"}}}, [
            "funnel_limits['cfg.*']: 'key'='{customer}' is not supported in worker-wide limits",
            "use a FunnelTask with funnel_key",
        ]),
        ({"funnel_limits": {"cfg.*": {"rate": "5/s", "capacity": 4, "cost": 2}}}, [
            "funnel_limits['cfg.*']: 'cost'=2 is not supported in worker-wide limits",
        ]),
        ({"funnel_limits": {"cfg.*": {"rate": "5/s", "capacity": 10**12}}}, [
            "funnel_limits['cfg.*']: capacity must be an integer from 1 to 1_000_000",
        ]),
    ],
)  # fmt: skip
def test_mistakes_stop_the_worker_at_start(
    standalone_url: str, conf: dict[str, Any], named: list[str]
) -> None:
    message = worker_start_error(make_app(standalone_url, funnel_redis_url=standalone_url, **conf))
    here = os.path.relpath(HERE)
    for text in named:
        assert text.replace("{here}", here) in message


@pytest.mark.redis
def test_a_plain_task_with_funnel_options_stops_the_worker(standalone_url: str) -> None:
    app = Celery("cfg", broker=standalone_url)
    app.conf.update(funnel_redis_url=standalone_url, worker_hijack_root_logger=False)

    @app.task(
        name="cfg.plain", shared=False, funnel_rate="5/s"
    )  # before install(): not checked here
    def plain(n: int = 0) -> int:
        return n

    line = plain.__wrapped__.__code__.co_firstlineno
    message = worker_start_error(install(app))
    assert f"task 'cfg.plain' (defined at {os.path.relpath(HERE)}:{line})" in message
    assert "funnel_rate='5/s' given, but the task is not a FunnelTask" in message


@pytest.mark.redis
@pytest.mark.parametrize("limits", [{}, {"cfg.*": "5/s"}], ids=["FunnelTask", "funnel_limits"])
def test_no_funnel_redis_url_stops_the_worker(standalone_url: str, limits: dict[str, Any]) -> None:
    message = worker_start_error(make_app(standalone_url, funnel_limits=limits))
    assert "funnel_redis_url is not set" in message
    assert "it is needed by cfg.send" in message


@pytest.mark.redis
def test_every_mistake_is_listed_at_once(standalone_url: str) -> None:
    message = worker_start_error(
        make_app(
            standalone_url,
            funnel_limit={"cfg.*": "5/s"},
            task_annotations={"cfg.plain": {"funnel_rate": "9/s"}},
        )
    )
    assert message.startswith("2 celery-funnel configuration errors:")
    assert "funnel_limit=" in message
    assert "task 'cfg.plain'" in message


@pytest.mark.redis
def test_wildcard_annotations_and_celerys_booleans_start_and_throttle(
    standalone_url: str, recorder: Recorder
) -> None:
    """``"*"`` annotations reach plain tasks too (meant for the FunnelTasks), and the
    string "false" means False: the worker starts and the funnel defers."""
    app = make_app(
        standalone_url,
        funnel_redis_url=standalone_url,
        funnel_dry_run="false",
        funnel_reservation="no",
        task_annotations={"*": {"funnel_capacity": 1}, "cfg.send": {"funnel_rate": "1/h"}},
    )
    try:
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
            settings = runtime_for(app).settings
            assert (settings.dry_run, settings.reservation) == (False, False)
            for n in range(2):
                app.tasks["cfg.send"].delay("c1", n)
            wait_for(lambda: any(not d.get("dry_run") for d in recorder.of("task_deferred")))
    finally:
        runtime_for(app).close()
        app.close()


# --- at worker start: an app that never called install(app) ---


@pytest.mark.redis
@pytest.mark.parametrize(
    ("conf", "found"),
    [
        ({"funnel_limits": {"cfg.*": "5/s"}}, "app.conf.funnel_limits"),
        ({}, "FunnelTask 'cfg.send'"),
        ({"task_annotations": {"cfg.plain": {"funnel_rate": "5/s"}}}, "task 'cfg.plain'"),
    ],
    ids=["funnel_limits", "FunnelTask", "annotated"],
)
def test_an_in_process_worker_without_install_stops_at_start(
    standalone_url: str, conf: dict[str, Any], found: str
) -> None:
    app = Celery("cfg", broker=standalone_url)
    app.conf.update(worker_hijack_root_logger=False, **conf)
    if "funnel_limits" not in conf:

        @app.task(name="cfg.send", shared=False, base=FunnelTask, funnel_rate="5/s")
        def send(n: int = 0) -> int:
            return n

    @app.task(name="cfg.plain", shared=False)
    def plain(n: int = 0) -> int:
        return n

    message = worker_start_error(app)
    assert message.startswith("app 'cfg' uses celery-funnel (")
    assert found in message
    assert "install(app) was never called" in message


UNINSTALLED = """\
import os

from celery import Celery
{imports}
app = Celery("cfg_uninstalled", broker=os.environ["CFG_BROKER"])
{body}

@app.task{options}
def send(n=0):
    return n
"""


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize(
    ("imports", "body", "options", "found"),
    [
        ("", 'app.conf.funnel_limits = {"cfg_uninstalled.*": "5/s"}\n', "",
         "app.conf.funnel_limits"),
        ("from celery_funnel import FunnelTask\n",
         'app.conf.funnel_redis_url = os.environ["CFG_BROKER"]\n',
         '(base=FunnelTask, funnel_rate="5/s")', "FunnelTask 'cfg_uninstalled.send'"),
    ],
    ids=["funnel_limits", "FunnelTask"],
)  # fmt: skip
def test_a_celery_worker_without_install_stops_at_start(
    tmp_path: Path, standalone_url: str, imports: str, body: str, options: str, found: str
) -> None:
    """Nothing in the first app imports celery_funnel: the ``celery`` command loads the
    package through its entry point, which sees the settings at ``worker_init``."""
    source = UNINSTALLED.format(imports=imports, body=body, options=options)
    code, logs = refused_start(tmp_path, "cfg_uninstalled", source, standalone_url)
    assert code != 0
    assert "ConfigurationError: app 'cfg_uninstalled' uses celery-funnel (" in logs
    assert found in logs
    assert "install(app) was never called" in logs
    assert " ready." not in logs
    # said once, in one line: not Celery's traceback of its start-up code
    assert "Traceback" not in logs
    assert sum("ConfigurationError" in line for line in logs.splitlines()) == 1, logs


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize(
    "source",
    [
        # no celery-funnel at all (a FUNNEL_* setting of some other library aside)
        UNINSTALLED.format(imports="", body='app.conf.FUNNEL_ANALYTICS_ID = "x"\n', options=""),
        UNINSTALLED.format(
            imports="from celery_funnel import FunnelTask, install\n",
            body='install(app)\napp.conf.funnel_redis_url = os.environ["CFG_BROKER"]\n',
            options='(base=FunnelTask, funnel_rate="5/s")',
        ),
    ],
    ids=["plain-app", "installed"],
)
def test_a_celery_worker_of_a_sound_app_starts(
    tmp_path: Path, standalone_url: str, source: str
) -> None:
    (tmp_path / "cfg_uninstalled.py").write_text(source)
    with CeleryWorkers(
        "cfg_uninstalled", 1, {"CFG_BROKER": standalone_url}, "--pool", "solo", cwd=str(tmp_path)
    ) as workers:
        assert "install(app) was never called" not in workers.logs()
