"""The ``celery-funnel`` command (also ``python -m celery_funnel``)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from .._limiter.errors import FunnelError
from .errors import debugging


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``argv`` and run the chosen command."""
    parser = argparse.ArgumentParser(prog="celery-funnel", description="celery-funnel tools")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="real Celery workers sharing one funnel")
    demo.add_argument("--rate", default="10/s", help="the funnel's rate (default 10/s)")
    demo.add_argument("--capacity", type=int, default=5, help="burst capacity (default 5)")
    demo.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    demo.add_argument("--tasks", type=int, default=100, help="tasks to send (default 100)")
    demo.add_argument("--redis", metavar="URL", help="use this Redis, not a private one")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from ..demo import run  # noqa: PLC0415 - keeps `--help` fast

        # SIGTERM unwinds like Ctrl-C, so that the demo stops its workers and Redis
        signal.signal(signal.SIGTERM, _interrupt)
        if hasattr(signal, "pthread_sigmask"):  # a mask inherited would hold it back for good
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        try:
            run(args.rate, args.capacity, args.workers, args.tasks, args.redis)
        except KeyboardInterrupt:
            print("\ninterrupted: the demo's workers and Redis are stopped", file=sys.stderr)
            sys.exit(130)
        except FunnelError as error:  # a bad --rate, say: one line, not a traceback
            if debugging():
                raise
            parser.exit(1, f"celery-funnel: error: {error}\n")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
