"""Helpers shared by the reliability tests and ``bench/api_load.py``.

Nothing here depends on other test packages: settings are built explicitly (no ``.env``), the
database is seeded through the public :class:`~tuner.store.StudyStore` API, and the API server
runs as a real ``uvicorn`` subprocess where a test needs one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr
from sqlalchemy import Engine, text

from tests.environ import environ_without
from tuner.schedule import Schedule, Stage
from tuner.settings import Settings
from tuner.store import StudyStore, TrialStatus

REPO = Path(__file__).resolve().parents[2]
API = "/api/v1"
STUDIES = f"{API}/studies"
TABLES = ("stagetune_studies", "stagetune_trials", "stagetune_trial_metrics")

#: A small valid spec (digits, no baselines), the kind the crash tests queue.
SPEC: dict[str, Any] = {
    "task": "digits",
    "baselines": False,
    "budget": {"trials": 4, "seed_runs": 0},
}


def api_settings(
    database_url: str,
    *,
    tokens: list[str] | None = None,
    protect_reads: bool = False,
    max_request_bytes: int = 1_000_000,
) -> Settings:
    """Settings with every API option explicit, so the environment cannot change a test."""
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        database_url=database_url,
        api_tokens=[SecretStr(t) for t in tokens or []],
        api_token=None,
        protect_reads=protect_reads,
        max_request_bytes=max_request_bytes,
    )


def row_counts(engine: Engine) -> dict[str, int]:
    """Rows in each stagetune table (to prove a rejected request wrote nothing)."""
    with engine.connect() as conn:
        return {
            t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in TABLES
        }


def schedule_dict(*batches: int, epochs_per_stage: int = 2) -> dict[str, Any]:
    stages = tuple(
        Stage(start_epoch=i * epochs_per_stage, end_epoch=(i + 1) * epochs_per_stage, batch_size=b)
        for i, b in enumerate(batches)
    )
    return Schedule(stages=stages, base_lr=0.1, base_batch_size=batches[0]).to_dict()


@dataclass(frozen=True)
class SeededStudy:
    study_id: int
    trial_numbers: tuple[int, ...]
    running_number: int | None


def seed_study(
    store: StudyStore,
    *,
    trials: int = 4,
    epochs: int = 3,
    worker_id: str = "seed-worker",
    leave_running: bool = True,
    name: str = "seeded",
) -> SeededStudy:
    """A running study with ``trials`` trials of ``epochs`` epochs each: completed ones, one
    diverged (number 1 when there are at least three), and the last one still running."""
    study = store.create_study("digits", SPEC, max(trials, 1), name=name)
    claimed = store.claim_study(worker_id, 3600)
    assert claimed is not None, "nothing to claim"
    assert claimed.id == study.id, "another queued study was older"
    schedule = schedule_dict(32, 128)
    best: tuple[float, int] | None = None
    for number in range(trials):
        trial = store.create_trial(study.id, number, schedule, {"seed": number})
        for epoch in range(epochs):
            store.add_epoch_metrics(
                trial.id,
                epoch,
                {
                    "val_accuracy": 0.5 + 0.01 * epoch + 0.001 * number,
                    "val_loss": 1.0 / (epoch + 1),
                    "train_loss": 1.1 / (epoch + 1),
                    "batch_size": 32,
                    "lr": 0.1,
                    "steps": 10,
                    "samples": 320,
                    "custom": number,
                },
            )
        last = number == trials - 1
        if last and leave_running:
            continue
        diverged = number == 1 and trials >= 3
        acc = None if diverged else 0.6 + 0.001 * number
        store.finish_trial(
            trial.id,
            TrialStatus.DIVERGED if diverged else TrialStatus.COMPLETED,
            stop_reason="loss became NaN" if diverged else None,
            final={"val_accuracy": acc, "steps": 30, "samples": 960},
        )
        if acc is not None and (best is None or acc > best[0]):
            best = (acc, trial.id)
    if best is not None:
        store.set_best(study.id, best[1], best[0])
    return SeededStudy(
        study_id=study.id,
        trial_numbers=tuple(range(trials)),
        running_number=trials - 1 if leave_running and trials else None,
    )


PG_SERVER_URL = os.environ.get(
    "STAGETUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@contextmanager
def pg_database(prefix: str = "stagetune_rel") -> Iterator[str]:
    """A fresh PostgreSQL database on the test server (dropped afterwards), for fixtures whose
    scope is wider than the root conftest's function-scoped ``pg_url``."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    server = PG_SERVER_URL.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = PG_SERVER_URL.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- a real API server in a subprocess ---------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: no STAGETUNE_* from the developer's shell."""
    env = environ_without("STAGETUNE_")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


@dataclass
class Server:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextmanager
def api_server(
    database_url: str,
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    workers: int = 1,
    start_timeout_s: float = 60.0,
    keep_alive_s: int | None = None,
) -> Iterator[Server]:
    """``uvicorn --factory api.app:create_app`` on a free loopback port, stopped on exit.

    ``keep_alive_s`` sets how long the server keeps an idle connection open (uvicorn's
    ``--timeout-keep-alive``, whole seconds; its default, 5 s, when None).
    """
    port = free_port()
    child_env = clean_env({"STAGETUNE_DATABASE_URL": database_url, **(env or {})})
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "api.app:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
        "--workers",
        str(workers),
        *(["--timeout-keep-alive", str(keep_alive_s)] if keep_alive_s is not None else []),
    ]
    log_file = open(log_path, "wb")  # noqa: SIM115 (closed in finally)
    process = subprocess.Popen(
        cmd, cwd=REPO, env=child_env, stdout=log_file, stderr=subprocess.STDOUT
    )
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"API server exited with {process.returncode}:\n{server.log()}")
            try:
                if httpx.get(f"{server.base_url}{API}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"API server did not start in {start_timeout_s} s:\n{server.log()}"
                )
            time.sleep(0.2)
        yield server
    finally:
        stop_process(process)
        log_file.close()


def stop_process(process: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s`` (only this process, by its pid)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout_s)


# -- a writer process, like a dispatcher ---------------------------------------------------

WRITER_CODE = (
    "import sys; from tests.reliability.helpers import run_writer; "
    "run_writer(sys.argv[1], float(sys.argv[2]), sys.argv[3])"
)


def run_writer(url: str, seconds: float, result_path: str, epochs: int = 5) -> None:
    """Write a study the way a dispatcher does, as fast as possible, for ``seconds``:
    claim it, then trials (create, one ``add_epoch_metrics`` per epoch, finish) and
    heartbeats. Counts and the first error go to ``result_path`` as JSON."""
    import json

    writes = errors = trials = 0
    first_error = ""
    deadline = time.monotonic() + seconds
    with StudyStore(url) as store:
        try:
            study = store.create_study("digits", SPEC, 1_000_000, name="being-written")
            claimed = store.claim_study("soak-writer", 3600)
            assert claimed is not None
            assert claimed.id == study.id, "an older queued study exists"
            writes += 2
        except Exception as exc:
            Path(result_path).write_text(json.dumps({"errors": 1, "first_error": repr(exc)}))
            raise
        schedule = schedule_dict(32, 64)
        number = 0
        while time.monotonic() < deadline:
            try:
                trial = store.create_trial(study.id, number, schedule, {"seed": number})
                writes += 1
                for epoch in range(epochs):
                    store.add_epoch_metrics(
                        trial.id, epoch, {"val_accuracy": 0.5 + epoch / 100, "val_loss": 1.0}
                    )
                    writes += 1
                store.finish_trial(trial.id, TrialStatus.COMPLETED, final={"val_accuracy": 0.55})
                store.heartbeat(study.id, "soak-writer")
                writes += 2
                trials += 1
            except Exception as exc:  # counted: any failed write is a test failure
                errors += 1
                first_error = first_error or f"{type(exc).__name__}: {exc}"
            number += 1
    Path(result_path).write_text(
        json.dumps(
            {
                "study_id": study.id,
                "writes": writes,
                "trials": trials,
                "errors": errors,
                "first_error": first_error,
            }
        )
    )


def start_writer(
    url: str, seconds: float, result_path: Path, log_path: Path
) -> subprocess.Popen[bytes]:
    log = open(log_path, "wb")  # noqa: SIM115 (the child holds it; closed when it exits)
    try:
        return subprocess.Popen(
            [sys.executable, "-c", WRITER_CODE, url, str(seconds), str(result_path)],
            cwd=REPO,
            env=clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    finally:
        log.close()
