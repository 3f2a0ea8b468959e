"""The options and settings reference (docs/reference.md), written from the code's own
tables: every name of ``options.OPTIONS`` and of the settings' defaults must have a line
here, or ``tests/unit/test_docs.py`` fails.

    python -m celery_funnel._config.reference docs/reference.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from .._limiter import strategies
from .options import OPTIONS
from .settings import _DEFAULTS as SETTING_DEFAULTS


def _strategy_help() -> str:
    """Every registered strategy but the default, and which of them book no slot."""
    others = [name for name in strategies.names() if name != strategies.DEFAULT]
    plain = [name for name in others if not strategies.capabilities(name).books]
    text = "or " + ", ".join(f'`"{name}"`' for name in others)
    if plain == others:
        return f"{text} (these book no slot)"
    return f"{text}; " + ", ".join(f'`"{name}"`' for name in plain) + " book no slot"


# option -> (default, meaning)
OPTION_HELP: dict[str, tuple[str, str]] = {
    "funnel_rate": (
        "none: no limit",
        'as Celery reads `rate_limit`: `"N/s"`, `"N/m"`, `"N/h"`, and `"N"` or a number `N`'
        ' (per second); `N` may be a fraction (`"0.5/s"` = 1 per 2 s, `"1.5/m"` = 3 per'
        ' 120 s, kept exact). Also `"N/d"` and `"N/<float>s"` (`"5/2.5s"`, `"100/15m"`).'
        " The same forms wherever a rate is given: `funnel_limits` entries,"
        " `celery funnel set`, the dashboard",
    ),
    "funnel_capacity": (
        "1",
        'how many may start back to back from an idle funnel (1 to 1 000 000; `3` or `"3"`)',
    ),
    "funnel_strategy": (f'`"{strategies.DEFAULT}"`', _strategy_help()),
    "funnel_key": (
        "one funnel per task",
        'a format string over the task\'s arguments (`"{customer_id}"`, defaults applied) or'
        " a callable taking `*args, **kwargs`: one funnel per value (it also splits"
        " `funnel_concurrency`, `funnel_max_waiting`, `funnel_unique` and `funnel_debounce`)",
    ),
    "funnel_cost": (
        "1",
        "units one task takes: an int, or a callable taking the task's arguments; 0 = free",
    ),
    "funnel_limits": (
        "`()`",
        "more limits for the task, as dicts (`rate`, `capacity`, `key`, `cost`, `fair_by`,"
        " `weights`); all must admit the task at once (GCRA only)",
    ),
    "funnel_on_backend_error": (
        "the setting",
        'this task\'s policy when the funnels\' Redis fails: `"defer"`, `"allow"` or `"raise"`',
    ),
    "funnel_dry_run": (
        "the setting",
        "`True`: never defer this task, only report what would have been deferred",
    ),
    "funnel_fair_by": (
        "none",
        "share the funnel's rate between tenants with tasks waiting (weighted round-robin):"
        " a format string over the task's arguments or a callable taking them, like"
        " `funnel_key`; needs `funnel_rate` (GCRA) and parking",
    ),
    "funnel_weights": (
        "every tenant 1",
        "with `funnel_fair_by`: a mapping tenant -> weight (a number > 0; missing tenants"
        " weigh 1) or a callable taking the tenant",
    ),
    "funnel_concurrency": (
        "none",
        'at most N running at once across every worker (`3` or `"3"`; per `funnel_key` when'
        " set), held as leases that a dead worker cannot leak (see `funnel_lease_ttl`)",
    ),
    "funnel_max_waiting": (
        "none",
        "producer back-pressure: `delay`/`apply_async` raise"
        " `celery_funnel.TooManyWaitingError` (nothing sent) while this many tasks of the"
        " funnel (per `funnel_key`) are sent and not yet started (the error's `waiting`,"
        " `limit`, `funnel` and `task` say so); a retry of a task accepted once is never"
        " refused; a task leaves the count when it starts, is revoked or expires, or fails"
        " before starting; an entry never seen to leave stops counting after an hour, and"
        " `celery funnel reset NAME` forgets the count with the funnel",
    ),
    "funnel_unique": (
        "off",
        "`True`: while a task of the same `funnel_key` (required) waits or runs, a send"
        " publishes nothing and returns that task's `AsyncResult`; a duplicate sent past"
        " the task (`send_task`) is dropped by the worker, marked REVOKED"
        " ([Debounce and unique](debounce.md))",
    ),
    "funnel_unique_ttl": (
        "600",
        "seconds (from 3) a unique key lasts past its send or arrival; the worker running"
        " the task renews it every second, so a dead worker's key is free within it",
    ),
    "funnel_debounce": (
        "off",
        "seconds: sends of one `funnel_key` (required) collapse into one run, with the last"
        " send's arguments, when no send came for this long; every send gets the run's id;"
        " needs `funnel_park`, and AOF on the funnels' Redis or the broker's own Redis"
        " server as funnels' Redis ([Debounce and unique](debounce.md))",
    ),
    "funnel_debounce_max": (
        "none: no bound",
        "seconds: a debounced key runs at most this long after its window's first send"
        " (not less than `funnel_debounce`)",
    ),
    "funnel_adaptive": (
        "none: a fixed rate",
        '`{"min": "1/s", "decrease": 0.5, "increase": "1/s", "every": 1.0,'
        ' "probe": 60.0}`: the rate drops on an upstream\'s 429 and climbs back while calls'
        ' succeed, between `min` and `funnel_rate`, for every worker (`"adaptive"` in a'
        " `funnel_limits` entry; [Token budgets](llm.md))",
    ),
}

# setting -> meaning (the default is the code's own)
SETTING_HELP: dict[str, str] = {
    "funnel_redis_url": "required: Redis URL or redis-py client that keeps the funnels"
    " (`redis://`, `rediss://`, `unix://`, `redis+cluster://`, `redis+sentinel://`);"
    " never silently the broker's",
    "funnel_redis_options": "a dict of redis-py client options for `funnel_redis_url`"
    " (TLS files, Cluster options); it overrides `funnel_socket_timeout` for the keys it sets",
    "funnel_limits": 'task-name pattern -> rate, or `{"rate", "capacity", "strategy",'
    ' "scope": "global" | "worker", "windows", "concurrency", "variant", "name"}`; every'
    ' matching pattern must admit; `"variant"` names a registered concurrency variant'
    ' (default `"seats"`: at most `concurrency` running at once)',
    "funnel_key_prefix": "prefix of every key the package writes (no braces)",
    "funnel_max_countdown": "0.05 to 86 400 seconds; the countdown cap: longest a deferred"
    " task is held un-acked in a worker, and longest countdown published. `None`: half the"
    " Redis transport's `visibility_timeout` (3600 s -> 1800 s) or half RabbitMQ's"
    " `consumer_timeout` (1800 s -> 900 s)",
    "funnel_reservation": "deferred tasks book their slot; `False`: they compete again"
    " after the funnel's `retry_after`",
    "funnel_allowance": "`True` (the default): a worker takes k = min(64, rate x 0.05 s,"
    " capacity / 2) units of a funnel it decides densely (a run within the 0.05 s before)"
    " in one call while the funnel keeps at least half its burst free after, and starts"
    " that many runs without a call each, within 0.05 s; near full, every run is decided"
    " alone. Only for one GCRA funnel of cost 1 with"
    " `funnel_reservation` on (no concurrency, fair share, adaptive rate, override or pause,"
    " nor a task with an expiry). In any window of w seconds a funnel starts at most rate x"
    " w + capacity + k x workers runs (and never more than rate x 0.05 s over rate x w +"
    " capacity); k <= 1 (under 40/s, or capacity under 4) takes none. `False`: every run"
    " decided alone, exact",
    "funnel_max_deferrals": "a task deferred more often fails with `TooManyDeferralsError`"
    " (`None`: no cap)",
    "funnel_throttle_eager": "gate eager runs (`task_always_eager`, `apply()`) too, waiting"
    " in place",
    "funnel_socket_timeout": "0.01 to 300 seconds; bounds every Redis call of the gates",
    "funnel_on_backend_error": 'when the funnels\' Redis fails: `"defer"` holds the task for'
    ' a back-off (1, 2, 4 ... 30 s, counted as deferrals), `"allow"` runs it unthrottled,'
    ' `"raise"` fails it with `BackendError`',
    "funnel_dry_run": "run every task at once; only report (signals, metrics, an INFO log"
    " line) what would have been deferred; a deferred dry-run decision takes no unit and"
    " books nothing, so the counts are what the funnel would have admitted",
    "funnel_park": "park waits longer than `funnel_park_after` in the funnels' Redis"
    " instead of the broker, only where a task waits there as safely as in the broker's"
    ' queue (`"auto"`): that Redis has an append-only file, or is the broker\'s own Redis'
    " server; `True` insists (a Redis that is neither stops the worker at start); `False`"
    " never parks",
    "funnel_park_after": "seconds (0 to 3600, at most the countdown cap); shorter waits"
    " are held in the worker",
    "funnel_park_lease": "seconds (1 to 3600) a releaser's claim lasts: a releaser that"
    " dies is replaced after this long",
    "funnel_lease_ttl": "seconds (0.5 to 3600) a concurrency seat lasts unless its worker"
    " renews it: a dead worker's slots return after this long",
    "funnel_log_waits_over": "seconds (0 to 31 536 000); a deferral whose wait is longer is"
    " logged at INFO by the worker, once per deferral: `task NAME[ID] waits N.N s for FUNNEL"
    " (held|parked|republished)`; shorter waits are logged at DEBUG only",
    "funnel_log_summary_every": "seconds (0 to 86 400; 0: never); while tasks wait on a funnel,"
    " each worker logs one INFO line per funnel this often: `funnel FUNNEL: N held and N"
    " republished in this worker, N parked; the next due at HH:MM:SS UTC`",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def anchor(name: str, setting: bool = False) -> str:
    """The id of ``name``'s row: the name itself (``reference.md#funnel_rate``), or
    ``setting-<name>`` for a setting that shares its name with an option."""
    return f"setting-{name}" if setting and name in OPTIONS else name


def _name(name: str, setting: bool = False) -> str:
    """The name cell: a link to its own anchor, kept on one line (docs/extra.css)."""
    ident = anchor(name, setting)
    return f'<a class="cf-name" id="{ident}" href="#{ident}"><code>{name}</code></a>'


def render() -> str:
    """docs/reference.md, from ``OPTIONS``, the settings' defaults and the help above.

    Raises:
        KeyError: naming an option or setting that has no help line.
    """
    lines = [
        "# Options and settings reference",
        "",
        "<!-- written by `python3 dev.py docs` from celery_funnel/_config/reference.py:"
        " do not edit by hand -->",
        "",
        "Each name links to its own row: `reference.md#funnel_rate` is the option's;"
        " a setting named as an option is `#setting-<name>`"
        f" ({', '.join(f'`#setting-{n}`' for n in SETTING_DEFAULTS if n in OPTIONS)}).",
        "",
        "## Task options",
        "",
        "Set them on the decorator of a task with `base=FunnelTask`"
        ' (`@app.task(base=FunnelTask, funnel_rate="5/s")`), or on any FunnelTask through'
        " `task_annotations`, without touching its code.",
        "",
        "| option | default | meaning |",
        "| --- | --- | --- |",
    ]
    for name in OPTIONS:
        default, meaning = OPTION_HELP[name]
        lines.append(f"| {_name(name)} | {_cell(default)} | {_cell(meaning)} |")
    lines += [
        "",
        "## Settings",
        "",
        "Lowercase `funnel_*` in `app.conf`; `FUNNEL_*` and `CELERY_FUNNEL_*` work too, for"
        ' `config_from_object(..., namespace="CELERY")` (Django).',
        "",
        "| setting | default | meaning |",
        "| --- | --- | --- |",
    ]
    for name, value in SETTING_DEFAULTS.items():
        lines.append(f"| {_name(name, setting=True)} | `{value!r}` | {_cell(SETTING_HELP[name])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - the docs command
    Path(sys.argv[1]).write_text(render(), encoding="utf-8")
