"""The dispatcher (``stagetune worker``): claims queued studies and runs them, one at a time.

Loop: ``StudyStore.claim_study`` atomically hands this worker the oldest queued study, or a
running one whose heartbeat is older than ``stale_after_s`` (its worker died: the claim takes
it over, and the runner resumes it). While :func:`workers.runner.run_study` runs the study on
Ray (``RAY_ADDRESS`` or a local instance) a background thread heartbeats it every
``heartbeat_s``; the runner itself polls ``cancel_requested`` and stops a cancelled study.
When nothing is queued the dispatcher sleeps ``poll_s`` and looks again. Before each look it
removes what deleted studies left behind (their Ray Tune files on the storage path, their Optuna
studies: :mod:`tuner.leftovers`).

* If the runner raises, the study is marked ``failed`` with the error message (the runner does
  this itself; the dispatcher makes sure of it), and the dispatcher goes on with the next one.
* Shutdown (SIGTERM or SIGINT, see :func:`install_signal_handlers`): nothing new is claimed; a
  study that is running is interrupted (``KeyboardInterrupt`` in the runner), given back to the
  queue (``release_study``; a later claim resumes it) and its heartbeat stops; then the process
  exits with status 0. A dispatcher killed outright stops heartbeating, so another one takes
  its study over after ``stale_after_s``.
* ``once``: exit when the queue is empty; ``max_studies``: exit after that many studies.
* While the database is unreachable the dispatcher retries its claims with a growing delay
  (up to 30 s) instead of exiting.
* When the Ray cluster stops answering while a study runs (its head is lost: :class:`RayWatch`
  probes its GCS every ``heartbeat_s``) for ``ray_lost_s``, the study is given back to the
  queue with the reason, and ``on_ray_lost`` is called: Ray cannot connect a driver again
  once its cluster has gone, and ends the process itself after 60 s without it, by then with
  the study still claimed until its heartbeat went stale. The ``worker`` command exits then.
* When Ray cannot be reached as a study starts (``ClusterUnavailableError``: the cluster is
  down, or this machine's node of it is still starting), nothing of the study has run: it is
  given back to the queue, not failed, and the dispatcher claims again after the same growing
  delay. With ``once`` it gives the study back and stops (``DispatchStats.unavailable`` says
  why).

Several dispatchers (processes, machines) can share one database: each claim is atomic
(PostgreSQL ``FOR UPDATE SKIP LOCKED``, SQLite ``BEGIN IMMEDIATE`` plus a guarded update), so
every study runs in exactly one of them at a time.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from types import FrameType
from typing import Protocol

from sqlalchemy.exc import OperationalError

from tuner.errors import (
    ClusterUnavailableError,
    ConflictError,
    InvalidStateError,
    NotFoundError,
    StagetuneError,
)
from tuner.leftovers import remove_leftovers
from tuner.ray_probe import RAY_PROBE_TIMEOUT_S, probe_ray_address, tcp_address
from tuner.settings import Settings
from tuner.store import StudyRecord, StudyStatus, StudyStore

log = logging.getLogger(__name__)

#: Longest wait between two claims while the database is unreachable.
MAX_OUTAGE_BACKOFF_S = 30.0
#: Longest wait before trying again to remove a deleted study's files after failures.
LEFTOVERS_MAX_BACKOFF_S = 600.0

__all__ = [
    "DispatchStats",
    "Dispatcher",
    "Heartbeat",
    "RayWatch",
    "StudyRunner",
    "default_worker_id",
    "install_signal_handlers",
    "ray_runner",
]


class StudyRunner(Protocol):
    """Runs one claimed study to its end: ``(store, study_id, worker_id) -> anything``."""

    def __call__(self, store: StudyStore, study_id: int, worker_id: str) -> object: ...


def default_worker_id() -> str:
    """``<host>-<pid>-<random>``: unique per process, readable in the study's ``worker_id``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def ray_runner(settings: Settings) -> StudyRunner:
    """The production runner: :func:`workers.runner.run_study` with ``settings``.

    The engine connects to Ray when the study's experiment starts (the cluster ``RAY_ADDRESS``
    names, or a local instance, once per process) and keeps the dispatcher's SIGTERM / SIGINT
    handlers in place (:func:`tuner.engine.connect_ray`).
    """

    def run(store: StudyStore, study_id: int, worker_id: str) -> object:
        from workers.runner import run_study  # imports Ray: only where studies really run

        # Trials are persisted in the store; Tune's own CSV/JSON/TensorBoard files are not
        # needed (and its CSV logger leaks open files when an experiment is stopped early).
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
        return run_study(
            store,
            study_id,
            worker_id=worker_id,
            storage_path=settings.resolved_ray_storage_path,
            poll_s=min(settings.poll_s, settings.heartbeat_s),
        )

    return run


class Heartbeat:
    """A daemon thread that heartbeats a study every ``interval_s`` until stopped.

    It stops by itself when the store says the study is no longer this worker's (taken over,
    finished, deleted); ``lost`` then holds the reason.
    """

    def __init__(self, store: StudyStore, study_id: int, worker_id: str, interval_s: float) -> None:
        self.store = store
        self.study_id = study_id
        self.worker_id = worker_id
        self.interval_s = interval_s
        self.lost: str | None = None
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-study-{study_id}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.store.heartbeat(self.study_id, self.worker_id)
                self.beats += 1
            except (ConflictError, InvalidStateError, NotFoundError) as exc:
                self.lost = str(exc)
                log.info("study %s: heartbeat stopped: %s", self.study_id, exc)
                return
            except Exception:  # the database may be back at the next beat
                log.warning("study %s: heartbeat failed", self.study_id, exc_info=True)


def connected_gcs_address() -> str | None:
    """The address (``host:port``) of the GCS of the Ray cluster this process is connected
    to: ``RAY_ADDRESS`` where it has that form (the name the user gave it), else the one Ray
    connected to; ``None`` before it connects (or where Ray does not say: a Ray Client
    connection)."""
    if "ray" not in sys.modules:  # this process has not used Ray yet
        return None
    configured = os.environ.get("RAY_ADDRESS", "").strip()
    if configured.startswith("ray://"):
        return None  # a Ray Client connection: the GCS is the server's to reach, not ours
    import ray

    if not ray.is_initialized():
        return None
    if tcp_address(configured) is not None:
        return configured
    try:
        address = ray.get_runtime_context().gcs_address
    except Exception:
        return None
    return str(address) if address else None


class RayWatch:
    """A daemon thread that checks, every ``interval_s`` while a study runs, that the Ray
    cluster this process is connected to still answers: its GCS accepts a TCP connection
    (:func:`tuner.ray_probe.probe_ray_address`). Once it has not answered for ``lost_after_s``,
    ``on_lost(reason)`` is called from this thread, once, and the watch ends. Nothing is
    checked before the runner has connected to Ray, and with ``lost_after_s == 0`` not at
    all. ``address`` says where the GCS is (default: the cluster this process is connected
    to)."""

    def __init__(
        self,
        lost_after_s: float,
        on_lost: Callable[[str], None],
        *,
        interval_s: float,
        address: Callable[[], str | None] = connected_gcs_address,
    ) -> None:
        self.lost_after_s = lost_after_s
        self.interval_s = interval_s
        self._on_lost = on_lost
        self._address = address
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ray-watch", daemon=True)

    def __enter__(self) -> RayWatch:
        if self.lost_after_s > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        since: float | None = None  # when the first probe of this outage failed
        while not self._stop.wait(self.interval_s):
            address = self._address()
            if address is None:
                since = None
                continue
            try:
                probe_ray_address(address, timeout_s=min(RAY_PROBE_TIMEOUT_S, self.interval_s))
            except ClusterUnavailableError as exc:
                now = time.monotonic()
                if since is None:
                    since = now
                    log.warning(
                        "the Ray cluster at %s does not answer (%s); the study goes back to "
                        "the queue if it has not answered for %g s",
                        address,
                        exc.__cause__,
                        self.lost_after_s,
                    )
                if now - since < self.lost_after_s:
                    continue
                self._on_lost(
                    f"the Ray cluster at {address} has not answered for {now - since:.0f} s "
                    f"({exc.__cause__})"
                )
                return
            if since is not None:
                log.info("the Ray cluster at %s answers again", address)
            since = None


@dataclass
class DispatchStats:
    """What a dispatcher did: studies run (by outcome) and whether it was interrupted."""

    studies: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    interrupted: bool = False
    leftovers_removed: list[int] = field(default_factory=list)
    """Deleted studies whose files and Optuna study this dispatcher removed."""
    unavailable: str | None = None
    """Why the last study given back could not start (Ray unreachable); ``None`` otherwise."""
    ray_lost: str | None = None
    """Why the dispatcher stopped with its study given back: the Ray cluster was lost."""


class Dispatcher:
    """Claims studies from ``store`` and runs each with ``runner`` (see the module doc)."""

    def __init__(
        self,
        store: StudyStore,
        settings: Settings,
        *,
        runner: StudyRunner | None = None,
        worker_id: str | None = None,
        once: bool = False,
        max_studies: int | None = None,
        on_ray_lost: Callable[[str], None] | None = None,
        ray_address: Callable[[], str | None] = connected_gcs_address,
    ) -> None:
        if max_studies is not None and max_studies < 1:
            raise ValueError(f"max_studies must be at least 1, not {max_studies}")
        self.store = store
        self.settings = settings
        self.runner = runner or ray_runner(settings)
        self.worker_id = worker_id or default_worker_id()
        self.once = once
        self.max_studies = max_studies
        self.on_ray_lost = on_ray_lost
        self.ray_address = ray_address  # where the Ray watch finds the cluster's GCS
        self.stats = DispatchStats()
        self._stop = threading.Event()
        self._running: int | None = None  # the study the runner is working on
        self._interruptible = False  # inside the runner: a shutdown interrupts it
        self._schema_warned = False  # told once that the schema lacks the leftovers table
        # deleted studies whose files could not be removed: (failures, when to try again)
        self._removal_failures: dict[int, tuple[int, float]] = {}

    # -- control ---------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def running_study(self) -> int | None:
        return self._running

    def stop(self) -> None:
        """Claim nothing more; the loop ends after the current study (thread-safe)."""
        self._stop.set()

    def shutdown_signal(self, signum: int, frame: FrameType | None) -> None:
        """Signal handler (main thread): stop, and interrupt the study that is running."""
        first = not self._stop.is_set()
        self._stop.set()
        log.info("signal %s: shutting down (worker %s)", signum, self.worker_id)
        if first and self._interruptible:
            self._interruptible = False
            self.stats.interrupted = True
            raise KeyboardInterrupt

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> DispatchStats:
        """Run studies until stopped (or, with ``once``, until the queue is empty)."""
        log.info("dispatcher %s started", self.worker_id)
        outage_s = 0.0
        while not self._stop.is_set():
            if self.max_studies is not None and len(self.stats.studies) >= self.max_studies:
                break
            try:
                self.remove_leftovers()
                study = self.run_one()
            except OperationalError as exc:  # the database is unreachable: wait, try again
                outage_s = min(MAX_OUTAGE_BACKOFF_S, max(self.settings.poll_s, 2 * outage_s))
                log.warning("cannot claim studies (%s); retrying in %.1f s", exc, outage_s)
                self._stop.wait(outage_s)
                continue
            except ClusterUnavailableError as exc:  # the study went back to the queue
                self.stats.unavailable = str(exc)
                if self.once:  # the caller reports the reason (``stats.unavailable``)
                    log.info("stopping: the study went back to the queue")
                    break
                outage_s = min(MAX_OUTAGE_BACKOFF_S, max(self.settings.poll_s, 2 * outage_s))
                log.warning("%s; claiming again in %.1f s", exc, outage_s)
                self._stop.wait(outage_s)
                continue
            outage_s = 0.0
            self.stats.unavailable = None
            if study is None:
                if self.once:
                    break
                self._stop.wait(self.settings.poll_s)
        log.info("dispatcher %s stopped after %d studies", self.worker_id, len(self.stats.studies))
        return self.stats

    def remove_leftovers(self) -> None:
        """Remove what deleted studies left behind: their files on the Ray storage path and
        their Optuna studies (:func:`tuner.leftovers.remove_leftovers`)."""
        now = time.monotonic()
        waiting = {study for study, (_, at) in self._removal_failures.items() if at > now}
        try:
            removal = remove_leftovers(
                self.store, self.settings.resolved_ray_storage_path, skip=waiting
            )
        except InvalidStateError as exc:  # a schema older than the code: studies still run
            if not self._schema_warned:
                self._schema_warned = True
                log.warning("not removing deleted studies' files: %s", exc)
            return
        self.stats.leftovers_removed.extend(removal.studies)
        for study in removal.studies:
            self._removal_failures.pop(study, None)
        # try again later, waiting longer after each failure or each look that found no files
        for study in (*removal.failed, *removal.waiting):
            failures = self._removal_failures.get(study, (0, 0.0))[0] + 1
            delay = min(LEFTOVERS_MAX_BACKOFF_S, self.settings.poll_s * 2**failures)
            self._removal_failures[study] = (failures, now + delay)

    def run_one(self) -> StudyRecord | None:
        """Claim one study and run it to its end; returns the study as claimed, ``None`` if
        there was nothing to claim."""
        study = self.store.claim_study(self.worker_id, self.settings.stale_after_s)
        if study is None:
            return None
        resumed = f" (taking it over, attempt {study.attempts})" if study.attempts > 1 else ""
        log.info("worker %s claimed study %s%s", self.worker_id, study.id, resumed)
        self.stats.studies.append(study.id)
        self._running = study.id
        try:
            with (
                Heartbeat(self.store, study.id, self.worker_id, self.settings.heartbeat_s),
                RayWatch(
                    self.settings.ray_lost_s,
                    lambda reason: self._ray_lost(study.id, reason),
                    interval_s=min(self.settings.heartbeat_s, self.settings.ray_lost_s / 3),
                    address=self.ray_address,
                ),
            ):
                self._run_study(study.id)
        finally:
            self._running = None
        return study

    def _ray_lost(self, study_id: int, reason: str) -> None:
        """(The Ray watch's thread.) The study goes back to the queue with the reason, the
        dispatcher claims nothing more, and ``on_ray_lost`` is told (the ``worker`` command
        exits: the runner's Tune loop waits on a cluster that is gone)."""
        self.stats.ray_lost = reason
        self._stop.set()
        log.error("study %s: %s; giving it back to the queue", study_id, reason)
        self._release(study_id, reason=f"given back: {reason}")
        if self.on_ray_lost is not None:
            self.on_ray_lost(reason)

    def _run_study(self, study_id: int) -> None:
        try:
            try:
                self._interruptible = not self._stop.is_set()
                if not self._interruptible:  # a shutdown came between claim and run
                    raise KeyboardInterrupt
                self.runner(self.store, study_id, self.worker_id)
            finally:
                self._interruptible = False
        except KeyboardInterrupt:
            self._stop.set()
            self.stats.interrupted = True
            self._release(study_id)
            return
        except ClusterUnavailableError as exc:
            # the runner gave it back already; this makes sure of it
            self._release(study_id, reason=f"not started: {exc}")
            raise
        except Exception as exc:
            log.exception("study %s failed", study_id)
            self.stats.failed.append(study_id)
            self._fail(study_id, _error_message(exc))
            return
        self._check_finished(study_id)

    def _release(self, study_id: int, reason: str | None = None) -> None:
        """Give an interrupted study back to the queue (unless the runner already did)."""
        with suppress(ConflictError, InvalidStateError, NotFoundError):
            # (released by the runner, finished, or taken over already)
            self.store.release_study(study_id, self.worker_id, reason)
        self.stats.released.append(study_id)
        log.info("study %s given back to the queue", study_id)

    def _fail(self, study_id: int, message: str) -> None:
        with suppress(ConflictError, InvalidStateError, NotFoundError):
            # (finished by the runner already, or another worker's now)
            self.store.finish_study(
                study_id, StudyStatus.FAILED, error=message, worker_id=self.worker_id
            )

    def _check_finished(self, study_id: int) -> None:
        """A runner that returns leaves the study finished; if not, it is failed here."""
        try:
            study = self.store.get_study(study_id)
        except NotFoundError:
            return
        if study.status is StudyStatus.RUNNING and study.worker_id == self.worker_id:
            self.stats.failed.append(study_id)
            self._fail(study_id, "the runner returned without finishing the study")


def _error_message(exc: BaseException) -> str:
    if isinstance(exc, StagetuneError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def install_signal_handlers(dispatcher: Dispatcher) -> Callable[[], None]:
    """Make SIGTERM and SIGINT shut ``dispatcher`` down gracefully (main thread only).

    Ray Tune's own SIGINT handler (which would end the experiment early and let the runner
    mark the study failed) is switched off for this process. Returns a function that puts
    the previous handlers back.
    """
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    previous = {
        sig: signal.signal(sig, dispatcher.shutdown_signal)
        for sig in (signal.SIGTERM, signal.SIGINT)
    }

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
