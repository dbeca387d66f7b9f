"""Service commands: ``serve`` (the REST API, with an embedded dispatcher by default) and
``worker`` (a dispatcher on its own).

Settings come from ``STAGETUNE_*`` environment variables (:class:`tuner.settings.Settings`);
the options here override the ones a command line usually changes. On the embedded default
(SQLite), both commands create or upgrade the schema on start; a PostgreSQL database is
migrated explicitly (``alembic upgrade head``).

``serve`` runs the embedded dispatcher as a child process (``stagetune worker``) on the same
database, restarts it if it dies, and stops it (SIGTERM, so its study goes back to the queue)
when the server shuts down. Production runs ``serve --no-dispatcher`` and ``worker``
processes separately.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Annotated

import typer

from workers.cli.app import EXIT_FAILURE, app

log = logging.getLogger("stagetune.serve")

#: How long a stopping server waits for its dispatcher to give its study back.
DISPATCHER_STOP_TIMEOUT_S = 60.0
#: Least time between two starts of a dispatcher that keeps dying.
DISPATCHER_RESTART_BACKOFF_S = 10.0


def _prepare_database(url: str) -> None:
    """Create or upgrade the schema of the embedded SQLite database."""
    from tuner.store.engine import is_sqlite
    from tuner.store.migrate import upgrade

    if is_sqlite(url):
        upgrade(url)


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@app.command()
def worker(
    once: Annotated[
        bool, typer.Option("--once", help="Run what is queued now, then exit.")
    ] = False,
    max_studies: Annotated[
        int | None,
        typer.Option("--max-studies", min=1, help="Exit after running this many studies."),
    ] = None,
    worker_id: Annotated[
        str | None,
        typer.Option("--worker-id", help="Name of this worker (default: host-pid-random)."),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="Logging level.")] = "info",
) -> None:
    """Run the dispatcher: claim queued studies and run them on Ray (RAY_ADDRESS or local).

    SIGTERM or Ctrl+C gives a running study back to the queue and exits.

    So does a lost Ray cluster (no answer for STAGETUNE_RAY_LOST_S seconds), with exit status 1.
    """
    from tuner.errors import ClusterUnavailableError
    from tuner.settings import get_settings
    from tuner.store import StudyStore
    from workers.dispatcher import Dispatcher, install_signal_handlers
    from workers.gang_pool import close_driver_pool

    _configure_logging(log_level)
    settings = get_settings()
    url = settings.resolved_database_url
    _prepare_database(url)
    with StudyStore(url) as store:
        dispatcher = Dispatcher(
            store,
            settings,
            worker_id=worker_id,
            once=once,
            max_studies=max_studies,
            on_ray_lost=_exit_ray_lost,
        )
        restore = install_signal_handlers(dispatcher)
        try:
            stats = dispatcher.run()
        finally:
            # Its warm gangs end with the command, under the graceful handlers still: a second
            # SIGTERM or SIGINT (a supervisor repeating the signal, Ctrl+C on `serve`, which
            # then stops its dispatcher with SIGTERM too) must not kill the command with its
            # pool left on the nodes.
            close_driver_pool(wait_s=10, strict=False)
            restore()
    typer.echo(
        f"stagetune worker {dispatcher.worker_id}: ran {len(stats.studies)} studies"
        + (f", {len(stats.failed)} failed" if stats.failed else "")
        + (f", gave back {len(stats.released)}" if stats.released else ""),
        err=True,
    )
    if once and stats.unavailable is not None:
        # --once stopped at a study it could not start: not a clean run of the queue
        raise ClusterUnavailableError(stats.unavailable)


def _exit_ray_lost(reason: str) -> None:
    """The dispatcher's Ray cluster is gone mid-study, and its study back in the queue: exit
    now, with status 1, for a supervisor to start the worker again. Ray cannot connect this
    process to a cluster again, the study's Tune loop waits on the one that is gone (Ray ends
    the process itself after 60 s), and no teardown that talks to Ray could finish."""
    typer.echo(
        f"stagetune: error: {reason}; its study went back to the queue, and this worker exits "
        "(start it again once the cluster is back: a dispatcher resumes the study from its "
        "checkpoints)",
        err=True,
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_FAILURE)


class EmbeddedDispatcher:
    """``stagetune worker`` as a child process of ``serve``, restarted if it dies."""

    def __init__(self, database_url: str) -> None:
        self.env = {**os.environ, "STAGETUNE_DATABASE_URL": database_url}
        self.process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._watcher = threading.Thread(target=self._watch, name="dispatcher-watch", daemon=True)

    def start(self) -> None:
        self._spawn()
        self._watcher.start()

    def _spawn(self) -> None:
        command = [sys.executable, "-c", "from workers.cli import main; main()", "worker"]
        with self._lock:
            if self._stopping.is_set():
                return
            self.process = subprocess.Popen(command, env=self.env)
        log.info("embedded dispatcher started (pid %d)", self.process.pid)

    def _watch(self) -> None:
        while not self._stopping.is_set():
            process = self.process
            if process is None:
                return
            started = time.monotonic()
            code = process.wait()
            if self._stopping.is_set():
                return
            log.error("embedded dispatcher exited with status %s; restarting it", code)
            delay = DISPATCHER_RESTART_BACKOFF_S - (time.monotonic() - started)
            if self._stopping.wait(max(0.0, delay)):
                return
            self._spawn()

    def stop(self) -> None:
        """SIGTERM the dispatcher (it gives its study back) and wait for it to exit."""
        with self._lock:
            self._stopping.set()
            process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=DISPATCHER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.error("embedded dispatcher did not stop in time; killing it")
            process.kill()
            process.wait()


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


@app.command()
def serve(
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            envvar="STAGETUNE_HOST",
            show_envvar=True,
            help="Interface to listen on. [default: 127.0.0.1]",
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            min=1,
            max=65535,
            envvar="STAGETUNE_PORT",
            show_envvar=True,
            help="Port to listen on. [default: 8000]",
        ),
    ] = None,
    dispatcher: Annotated[
        bool,
        typer.Option(
            "--dispatcher/--no-dispatcher",
            help="Run a dispatcher next to the API (default); production runs `stagetune "
            "worker` processes instead.",
        ),
    ] = True,
    log_level: Annotated[str, typer.Option("--log-level", help="Logging level.")] = "info",
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            max=64,
            envvar="STAGETUNE_API_WORKERS",
            show_envvar=True,
            help="API server processes. One process answers one "
            "request at a time (the GIL); with several cores, 2 or more keep a slow request "
            "from delaying the others.",
        ),
    ] = 1,
) -> None:
    """Serve the REST API (OpenAPI docs at /docs) and, by default, run queued studies."""
    import uvicorn

    from api.app import create_server_app
    from tuner.settings import get_settings

    _configure_logging(log_level)
    settings = get_settings()
    url = settings.resolved_database_url
    # uvicorn re-raises SIGTERM after its graceful shutdown; this turns it into an exit that
    # still runs the clean-up below.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    embedded: EmbeddedDispatcher | None = None
    try:
        _prepare_database(url)
        if dispatcher:
            embedded = EmbeddedDispatcher(url)
            embedded.start()
        bind_host, bind_port = host or settings.host, port or settings.port
        if workers > 1:
            # Each process builds its app from the environment (the same settings).
            uvicorn.run(
                "api.app:create_server_app",
                factory=True,
                workers=workers,
                host=bind_host,
                port=bind_port,
                log_level=log_level.lower(),
            )
        else:
            uvicorn.run(
                create_server_app(settings),
                host=bind_host,
                port=bind_port,
                log_level=log_level.lower(),
            )
    finally:
        if embedded is not None:
            embedded.stop()
        signal.signal(signal.SIGTERM, previous)
