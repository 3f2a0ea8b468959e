"""``Runtime``: what celery-funnel keeps for one Celery app in one process (settings,
the funnel backend, the countdown policy), attached to the app, built lazily."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from .._limiter.backends._clients import mask_url
from .._limiter.backends.redis import RedisFunnel
from .._limiter.errors import ConfigurationError
from .._limiter.keys import limit_key, task_key
from .._stores.backlog import Backlog
from .._stores.check import Finding, check, report
from .._stores.debounce import DebounceStore
from .._stores.persistence import Persistence
from .._stores.unique import UniqueStore
from .broker import BrokerRedis
from .countdown import CountdownPolicy, policy_for
from .observe import Observer
from .outage import OutageLog
from .settings import FunnelSettings, read_setting
from .waiting import WaitPolicy

ATTRIBUTE = "_celery_funnel_runtime"
logger = logging.getLogger("celery_funnel")
# what a funnelled task does while the funnels' Redis does not answer, by policy
MEANWHILE = {
    "defer": "wait until it answers", "allow": "run unthrottled until it answers",
    "raise": "fail until it answers",
}  # fmt: skip


class Runtime:
    """Per-app state: read on first use, so that ``app.conf`` may be set after install."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._lock = threading.Lock()
        self.installed = False
        self.outage = OutageLog(app, on_recovered=self._recovered, probe=self._probe)

    @cached_property
    def settings(self) -> FunnelSettings:
        return FunnelSettings.from_conf(self.app.conf)

    @cached_property
    def redis_options(self) -> dict[str, Any]:
        """``funnel_redis_options``: keyword arguments for the redis-py client made from
        ``funnel_redis_url`` (TLS files, Cluster options, timeouts...), like Celery's
        ``redis_backend_use_ssl``; they override the socket timeouts.

        Raises:
            ConfigurationError: when it is not a dict with string keys.
        """
        options = read_setting(self.app.conf, "funnel_redis_options") or {}
        if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
            raise ConfigurationError(
                f"funnel_redis_options must be a dict of redis-py client options"
                f" (e.g. {{'ssl_ca_certs': '/path/ca.pem'}}), got {type(options).__name__}"
            )
        return dict(options)

    @cached_property
    def funnel(self) -> RedisFunnel:
        target = self.settings.require_redis()
        options = self.redis_options
        if isinstance(target, str):
            timeout = self.settings.socket_timeout
            options = {"socket_timeout": timeout, "socket_connect_timeout": timeout, **options}
            return RedisFunnel.from_url(target, **options)
        if options:
            raise ConfigurationError(
                "funnel_redis_options apply to a funnel_redis_url given as a URL; with a"
                " client object, configure the client itself"
            )
        return RedisFunnel(target)

    @cached_property
    def observer(self) -> Observer:
        return Observer(self.app, self.settings.log_waits_over)

    def _probe(self) -> None:
        """Raise unless the funnels' Redis answers (the outage's probe)."""
        self.funnel.client.ping()

    def _recovered(self) -> None:
        """The funnels' Redis answers again: it may have restarted (empty), so what it
        keeps is read again at the next wait."""
        persistence: Persistence | None = self.__dict__.get("persistence")
        if persistence is not None:
            persistence.stale()

    @cached_property
    def persistence(self) -> Persistence:
        """Whether tasks may be parked in the funnels' Redis (``funnel_park``): where
        it has AOF, or is the broker's own Redis server (``_stores.persistence.Rule``)."""
        broker = self.broker
        return Persistence(
            lambda: self.funnel.client, self.settings.park,
            broker=broker.client if broker.redis else None, broker_why=broker.why,
        )  # fmt: skip

    @cached_property
    def broker(self) -> BrokerRedis:
        """The broker's Redis server, asked only whether it is the funnels' Redis."""
        return BrokerRedis(self.app.conf)

    @cached_property
    def backlog(self) -> Backlog:
        """The backlogs of tasks sent and not yet started (``funnel_max_waiting``)."""
        return Backlog(self.funnel.client)

    @cached_property
    def unique(self) -> UniqueStore:
        """The keys of unique tasks (``funnel_unique``)."""
        return UniqueStore(self.funnel.client)

    @cached_property
    def debounce(self) -> DebounceStore:
        """The windows of debounced tasks (``funnel_debounce``)."""
        return DebounceStore(self.funnel.client, self.settings.key_prefix)

    @cached_property
    def countdowns(self) -> CountdownPolicy:
        return policy_for(self.app.conf, self.settings.max_countdown)

    @cached_property
    def waiting(self) -> WaitPolicy:
        """How a refused run waits (``_config.waiting``): asked by every place that
        makes one wait."""
        return WaitPolicy.of(self.settings.park_after, self.countdowns)

    def check_backend(self) -> list[Finding]:
        """Check the funnels' Redis (``backends._check.check``: credentials, ACL,
        replica, eviction, persistence) and log one line per problem; at worker start.
        Problems are reported, never raised: a Redis that is down now may be up later,
        and tasks meeting a configuration fault fail with ``BackendConfigurationError``.
        """
        funnel = self.funnel
        if not isinstance(funnel, RedisFunnel):
            return []
        findings = check(
            funnel, self.settings.key_prefix, parking=self.settings.park,
            persistence=self.persistence,
        )  # fmt: skip
        findings = [self._named(f) if f.topic == "connection" else f for f in findings]
        report(findings, logger)
        return findings

    def _named(self, finding: Finding) -> Finding:
        """A connection failure at worker start, naming the setting and its value (as
        the ``celery funnel`` command does) and saying what the worker does meanwhile:
        it starts (a Redis that is down now may answer later, as Celery waits for its
        broker), and its tasks with a funnel follow ``funnel_on_backend_error``; a
        configuration fault (a refused password, say) fails them until it is fixed."""
        policy = self.settings.on_backend_error
        if finding.message.startswith("Redis refused"):
            meanwhile = "fail until it is fixed (a configuration fault)"
        else:
            meanwhile = f"{MEANWHILE.get(policy, policy)} (funnel_on_backend_error={policy!r})"
        return Finding(
            finding.level, finding.topic,
            f"funnel_redis_url={mask_url(self.settings.redis_url)!r}:"
            f" {finding.message.rstrip('.')}. The worker starts; its tasks with a funnel"
            f" {meanwhile}: if it never answers, check the setting",
        )  # fmt: skip

    def close(self) -> None:
        """Close the funnel's Redis connections, if any were made (reopened on use)."""
        for store in ("backlog", "unique", "debounce"):  # on the client closed here
            self.__dict__.pop(store, None)
        funnel = self.__dict__.pop("funnel", None)
        if funnel is not None:
            funnel.client.close()
        broker = self.__dict__.get("broker")
        if broker is not None:
            broker.close()

    def task_key(self, task_name: str, key_part: str = "", index: int | None = None) -> str:
        """The funnel key of a FunnelTask's limit (``_limiter.keys.task_key`` under the prefix)."""
        return task_key(self.settings.key_prefix, task_name, key_part, index)

    def limit_key(self, pattern: str | None, worker: str = "") -> str:
        """The funnel key of a worker-wide limit (``_limiter.keys.limit_key`` under the prefix)."""
        return limit_key(self.settings.key_prefix, pattern, worker)


def runtime_for(app: Any) -> Runtime:
    """The app's ``Runtime``, created on first call."""
    runtime: Runtime | None = app.__dict__.get(ATTRIBUTE)
    if runtime is None:
        runtime = Runtime(app)
        setattr(app, ATTRIBUTE, runtime)
    return runtime
