"""The prose of BENCHMARKS.md's sections, beside the tables ``bench/run.py`` writes."""

CORE = """Client p50/p99 of one decision, interleaved call by call with PING on the same
connection, and the server's microseconds per decision (`INFO commandstats`, EVALSHA,
which includes the calls its script makes). `limits` (fixed, moving and sliding-counter
windows) and `pyrate-limiter` (Redis bucket) run in the same rounds on the same Redis
and connection pool, each with a limit it never reaches. The redis-server is pinned to
one core and the client to the other. The two `ref:` rows are floors: an empty script,
and the TIME + GET + SET that any GCRA on the server's clock must make; the two after
it add what that floor leaves out: reading TIME and the stored value as numbers, then
writing a computed value and TTL. `server / floor` divides by the TIME+GET+SET row."""

CORE_ASYNC = """The same, awaited (`bench/core_async.py`): `AsyncRedisFunnel` on a
`redis.asyncio` client, each call interleaved with an awaited PING on the same client,
`funnel.limit()` as `async with` (its decision books through `reserve`), and `limits.aio`
(its redis-py implementation) on the same connection pool."""

WORKER = """Tasks per second of ONE worker process (`-c 1`) draining a pre-filled queue of
no-op tasks: plain Celery (celery-funnel not installed), celery-funnel installed with
a plain task, a never-limited FunnelTask, and a plain task under a never-reached
`funnel_limits` entry; prefork and threads pools. Rows take turns round by round; the
ratio is the time per task over plain Celery's in the same round."""

INSTRUCTIONS = """The same two questions counted in instructions (valgrind's callgrind),
which do not move with the machine's load: per task, every process of one worker
(`-c 1`) while it drains pre-filled no-op tasks, the rows of the table above; per
decision, what the server runs inside EVALSHA (`evalShaCommand`, the scope that
`INFO commandstats` times) for each script of the first table. User-space instructions
only: time in system calls and network waits is not in them."""

PREFETCH = """A plain task and a never-limited FunnelTask of one installed app
(`bench/prefetch.py`), one worker (`-c 1`) draining no-op tasks sent at once, each
recording its start with one RPUSH, at `worker_prefetch_multiplier` 1 and 4, prefork
and threads; the two take turns round by round (the ratio pairs each FunnelTask round
with the plain round beside it), and callgrind counts every process of the worker."""

CELERY = """Real `celery worker` processes on a private Redis broker. Correctness: every task
is accounted for (none lost, none run twice) and the limit holds. Overhead: no-op tasks
on one worker, a never-limited FunnelTask against a plain task, in alternating rounds;
each round of one is compared with its neighbour of the other, so drift cancels."""

ACCURACY = """2 and 4 `celery worker` processes (prefork, concurrency 2) share one 20/s funnel
of capacity 1 for 60 s, with tasks offered steadily at 1.5 x 20/s x the workers. The
same load under Celery's own `rate_limit="20/s"` shows why this package exists: it is
per worker, so the first second runs workers x 20. (After that, on the Redis transport,
Celery's rate-limited tasks slow to about one per second per worker, with or without
celery-funnel installed (checked with a plain Celery app): celery/celery#5927, open. The
per-worker burst is the point of the contrast.) Starts are the tasks' own
records; a task started twice would count twice. The broker and the funnels share one
Redis without an append-only file: a wait longer than a worker may hold a message
(reservation books slots well ahead) is parked there, as safe as the broker's own
queue, and released when due, which counts as one re-queue."""

MEMORY = """Redis `used_memory` before and after one decision on each of 100 000 distinct
funnels (pipelined; a 1/h rate so that none expires meanwhile), divided by the count.
GCRA funnels expire once full again, so idle funnels cost nothing; these are the costs
of busy ones."""

TRANSPORT = """celery-funnel's broker transport (`celery_funnel.transport:Transport`, issue 54:
its fetch takes a message and writes kombu's un-acked record in one script call, and
idle consumers wait on wake markers) against kombu's own Redis transport
(`bench/transport.py`): real `celery worker` processes of a plain Celery app (no
funnel) on private redis-servers, the producer on the worker's transport unless said.
Saturated: one worker drains no-op tasks queued before it started, the two transports
taking turns round by round, a fresh server each; publish to start: one idle worker per
row, all up at once, tasks sent to each in turn; idle: 20 workers (`-P solo`) per
transport and a server with no client, read in the same windows. The broker's figures
are its own: CPU from `INFO cpu`, commands from `INFO stats`, the fetch's microseconds
from `INFO commandstats`."""
