"""Load benchmark of the REST API's read endpoints while a study is being written.

What it does:

1. Builds a study of ``--trials`` trials with ``--metrics`` per-epoch metric rows in all
   (default 5,000 and 100,000: 20 epochs per trial), plus ``--studies`` small finished studies
   so the study list has a full page. A sample of trials (``--api-sample``) is written through
   the public :class:`~tuner.store.StudyStore` API and timed, the rest with bulk inserts
   through the store's engine (the store API would take minutes: the timing says how many);
2. starts the API (``uvicorn --factory api.app:create_server_app``, one process) on a free
   loopback port, and a writer process that keeps writing another study the way a
   dispatcher does (create a trial, one ``add_epoch_metrics`` per epoch, ``finish_trial``,
   heartbeats);
3. drives each read endpoint in turn for ``--duration`` seconds (and at least
   ``--min-requests`` requests, however long they take) with ``--concurrency``
   concurrent httpx clients: study list, trials page (random offsets and sorts), trial
   detail, per-trial metrics, study detail and pages of the study's learning curves
   (``/metrics?limit=50``, random offsets: 50 trials with all their epochs per response);
4. prints requests/s and p50/p90/p99 latency per endpoint, then one line
   ``api_load rps=.. p50_ms=.. p99_ms=..`` over the paginated endpoints (study list and
   trials page), and writes ``<out>.json`` and ``<out>.md``.

The exit status is 1 if any request failed (a 5xx or a transport error) or the writer hit an
error, and also when ``--check-target`` is given and the paginated p99 is over ``--target-ms``.

``--smoke`` runs a small version in a few seconds (CI: tests/reliability/test_bench_smoke.py).

Usage::

    python bench/api_load.py                         # SQLite in a temp dir, full size
    python bench/api_load.py --database-url postgresql://postgres@127.0.0.1:5432/bench
    python bench/api_load.py --smoke --out /tmp/api_load
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert, select, text

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from tuner.schedule import (  # noqa: E402
    Schedule,
    Stage,
    schedule_summary,
)
from tuner.store import StudyStatus, StudyStore, TrialStatus  # noqa: E402
from tuner.store.migrate import upgrade  # noqa: E402
from tuner.store.models import TrialMetricRow, TrialRow  # noqa: E402

API = "/api/v1"
SPEC: dict[str, Any] = {"task": "digits", "baselines": False, "budget": {"trials": 10}}
PAGINATED = ("study_list", "trials_page")
DEFAULT_OUT = REPO / "bench" / "results" / "api_load"


# -- data ----------------------------------------------------------------------------------


def _schedule(batch: int) -> dict[str, Any]:
    stages = (Stage(0, 10, batch), Stage(10, 20, batch * 4))
    return Schedule(stages=stages, base_lr=0.1, base_batch_size=batch).to_dict()


def _epoch_metrics(trial: int, epoch: int) -> dict[str, Any]:
    return {
        "val_accuracy": 0.5 + 0.02 * epoch + (trial % 97) / 1000,
        "val_loss": 1.0 / (epoch + 1),
        "train_loss": 1.1 / (epoch + 1),
        "epoch_time_s": 1.5,
        "samples_per_s": 900.0,
        "steps": 40,
        "samples": 1280,
        "batch_size": 32,
        "lr": 0.1,
        "noise_scale": 120.0,
    }


@dataclass
class BuildReport:
    trials: int
    metric_rows: int
    api_sample_trials: int
    api_sample_s: float
    api_s_per_trial: float
    api_extrapolated_s: float
    bulk_trials: int
    bulk_s: float
    filler_studies: int


def build_data(
    store: StudyStore, trials: int, metrics: int, api_sample: int, studies: int
) -> tuple[int, BuildReport]:
    """The big study (running, owned by ``bench-builder``) and ``studies`` small finished ones."""
    epochs = max(1, metrics // trials)
    for i in range(studies):
        filler = store.create_study("digits", SPEC, 10, name=f"filler-{i}", owner="bench")
        claimed = store.claim_study("bench-filler", 3600)
        assert claimed is not None
        assert claimed.id == filler.id
        store.finish_study(filler.id, StudyStatus.COMPLETED, worker_id="bench-filler")
    study = store.create_study("digits", SPEC, trials, name="big", owner="bench")
    claimed = store.claim_study("bench-builder", 24 * 3600)
    assert claimed is not None
    assert claimed.id == study.id
    schedule = _schedule(32)
    summary = schedule_summary(schedule)  # what the store writes with each trial

    # A sample through the store API: the rate the dispatcher writes at.
    sample = min(api_sample, trials)
    started = time.perf_counter()
    for number in range(sample):
        trial = store.create_trial(study.id, number, schedule, {"seed": number})
        for epoch in range(epochs):
            store.add_epoch_metrics(trial.id, epoch, _epoch_metrics(number, epoch))
        store.finish_trial(
            trial.id,
            TrialStatus.COMPLETED,
            final={"val_accuracy": 0.6 + (number % 97) / 1000, "steps": 40 * epochs},
        )
    api_s = time.perf_counter() - started
    per_trial = api_s / sample if sample else 0.0

    # The rest in bulk, through the store's engine.
    started = time.perf_counter()
    now = datetime.now(UTC)
    rest = range(sample, trials)
    chunk = 1000
    engine = store.engine
    for lo in range(sample, trials, chunk):
        numbers = list(rest[lo - sample : lo - sample + chunk])
        with engine.begin() as conn:
            conn.execute(
                insert(TrialRow),
                [
                    {
                        "study_id": study.id,
                        "number": n,
                        "baseline": None,
                        "schedule": schedule,
                        "params": {"seed": n},
                        "status": TrialStatus.COMPLETED.value,
                        "stop_reason": None,
                        "started_at": now - timedelta(seconds=trials - n + 60),
                        "finished_at": now - timedelta(seconds=trials - n),
                        "epochs_done": epochs,
                        "val_accuracy": 0.6 + (n % 97) / 1000,
                        "val_loss": 0.3,
                        "steps": 40 * epochs,
                        "samples": 1280 * epochs,
                        "wall_time_s": 1.5 * epochs,
                        "mean_batch_size": 32.0,
                        "objective_values": {"accuracy": 0.6},
                        "schedule_summary": summary,
                    }
                    for n in numbers
                ],
            )
            ids = conn.execute(
                select(TrialRow.id, TrialRow.number).where(
                    TrialRow.study_id == study.id, TrialRow.number.in_(numbers)
                )
            ).all()
            conn.execute(
                insert(TrialMetricRow),
                [
                    {"trial_id": tid, "epoch": e, **_epoch_metrics(n, e), "extra": {}}
                    for tid, n in ids
                    for e in range(epochs)
                ],
            )
    bulk_s = time.perf_counter() - started
    best = store.list_trials(study.id, sort="-val_accuracy", limit=1).items[0]
    assert best.val_accuracy is not None
    store.set_best(study.id, best.id, best.val_accuracy)
    report = BuildReport(
        trials=trials,
        metric_rows=trials * epochs,
        api_sample_trials=sample,
        api_sample_s=round(api_s, 2),
        api_s_per_trial=round(per_trial, 4),
        api_extrapolated_s=round(per_trial * trials, 1),
        bulk_trials=trials - sample,
        bulk_s=round(bulk_s, 2),
        filler_studies=studies,
    )
    return study.id, report


# -- the writer (a second process, like a dispatcher) -------------------------------------


def writer_main(url: str, stop: Event, result_path: str, epochs: int, pause_s: float) -> None:
    """Write trials and metrics of a new study until ``stop`` is set; the counts go to a file."""
    writes = errors = trials = 0
    first_error = ""
    try:
        with StudyStore(url) as store:
            study = store.create_study("digits", SPEC, 1_000_000, name="being-written")
            claimed = store.claim_study("bench-writer", 3600)
            assert claimed is not None
            assert claimed.id == study.id, "an older queued study exists"
            writes += 2
            schedule = _schedule(64)
            number = 0
            while not stop.is_set():
                try:
                    trial = store.create_trial(study.id, number, schedule, {"seed": number})
                    writes += 1
                    for epoch in range(epochs):
                        if stop.is_set():
                            break
                        store.add_epoch_metrics(trial.id, epoch, _epoch_metrics(number, epoch))
                        writes += 1
                        time.sleep(pause_s)
                    store.finish_trial(trial.id, TrialStatus.COMPLETED, final={"val_accuracy": 0.7})
                    store.heartbeat(study.id, "bench-writer")
                    writes += 2
                    trials += 1
                except Exception as exc:  # counted and reported: a failed write is a result
                    errors += 1
                    first_error = first_error or f"{type(exc).__name__}: {exc}"
                number += 1
    except Exception as exc:
        errors += 1
        first_error = first_error or f"{type(exc).__name__}: {exc}"
    Path(result_path).write_text(
        json.dumps(
            {"writes": writes, "errors": errors, "trials": trials, "first_error": first_error}
        )
    )


# -- the server ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            text_ = (task / "children").read_text().split()
            out.extend(int(c) for c in text_)
    except OSError:
        pass
    return out


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants (Linux /proc; 0 elsewhere)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
        stack.extend(_children(p))
    return total


@dataclass
class RunningServer:
    base_url: str
    pid: int


@contextmanager
def api_server(url: str, log_path: Path, workers: int = 1) -> Iterator[RunningServer]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGETUNE_")}
    env["STAGETUNE_DATABASE_URL"] = url
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [
        sys.executable, "-m", "uvicorn", "--factory", "api.app:create_server_app",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log",
        "--workers", str(workers),
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"the API server exited: {log_path.read_text()[-2000:]}")
                try:
                    if httpx.get(f"{base}{API}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the API server did not start in 60 s")
                time.sleep(0.2)
            yield RunningServer(base, process.pid)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


# -- the load ------------------------------------------------------------------------------


@dataclass
class EndpointResult:
    name: str
    concurrency: int
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_kb: float
    server_cpu_ms_per_request: float
    failures: int
    statuses: dict[str, int] = field(default_factory=dict)
    first_failure: str = ""


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


async def drive(
    server: RunningServer,
    name: str,
    make_path: Callable[[random.Random], str],
    duration_s: float,
    concurrency: int,
    max_requests: int,
    seed: int,
    min_requests: int = 1,
) -> EndpointResult:
    latencies: list[float] = []
    sizes: list[int] = []
    statuses: dict[str, int] = {}
    failures = 0
    first_failure = ""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    # This process built the data (SQLAlchemy, the store, 5,000 trials' records): a full
    # collection of its heap pauses the clients for tens of milliseconds, which would be
    # measured as server latency. What exists now stays out of the collector's view.
    gc.collect()
    gc.freeze()
    cpu_before = tree_cpu_s(server.pid)
    async with httpx.AsyncClient(base_url=server.base_url, limits=limits, timeout=60) as client:

        async def one(worker: int) -> None:
            nonlocal failures, first_failure
            rng = random.Random(seed * 1000 + worker)
            while len(latencies) + failures < max_requests and (
                time.perf_counter() < deadline or len(latencies) + failures < min_requests
            ):
                path = make_path(rng)
                t0 = time.perf_counter()
                try:
                    r = await client.get(path)
                    body = r.content
                except httpx.HTTPError as exc:
                    failures += 1
                    first_failure = first_failure or f"{path}: {type(exc).__name__}: {exc}"
                    continue
                dt = time.perf_counter() - t0
                statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
                if r.status_code >= 500 or r.status_code != 200:
                    failures += 1
                    first_failure = first_failure or f"{path}: {r.status_code} {body[:200]!r}"
                    continue
                latencies.append(dt)
                sizes.append(len(body))

        # The phase's clock starts here, after the set-up above: on a loaded machine (CI runs
        # this beside training, at idle priority) the set-up alone can outlast a short phase,
        # and a phase that ends before its first request measures nothing. It also runs until
        # at least ``min_requests`` requests have been made, however long they take.
        started = time.perf_counter()
        deadline = started + duration_s
        await asyncio.gather(*(one(w) for w in range(concurrency)))
        seconds = time.perf_counter() - started
    server_cpu = tree_cpu_s(server.pid) - cpu_before
    latencies.sort()
    ms = [x * 1000 for x in latencies]
    return EndpointResult(
        name=name,
        concurrency=concurrency,
        requests=len(latencies),
        seconds=round(seconds, 2),
        rps=round(len(latencies) / seconds, 1) if seconds else 0.0,
        p50_ms=round(percentile(ms, 50), 1),
        p90_ms=round(percentile(ms, 90), 1),
        p99_ms=round(percentile(ms, 99), 1),
        max_ms=round(ms[-1], 1) if ms else 0.0,
        mean_kb=round(sum(sizes) / len(sizes) / 1024, 1) if sizes else 0.0,
        server_cpu_ms_per_request=round(server_cpu * 1000 / len(latencies), 2)
        if latencies
        else 0.0,
        failures=failures,
        statuses=statuses,
        first_failure=first_failure,
    )


def endpoints(
    study_id: int, trials: int, studies: int
) -> list[tuple[str, Callable[[random.Random], str], bool]]:
    """(name, path maker, heavy) of every driven endpoint."""
    sorts = ("number", "-val_accuracy", "-finished_at", "steps")
    base = f"{API}/studies/{study_id}"

    def study_list(rng: random.Random) -> str:
        offset = rng.choice((0, 0, 0, rng.randrange(0, max(1, studies))))
        return f"{API}/studies?limit=50&offset={offset}"

    def study_metrics(rng: random.Random) -> str:
        offset = rng.randrange(0, max(1, trials - 50))
        return f"{base}/metrics?limit=50&offset={offset}"

    def trials_page(rng: random.Random) -> str:
        offset = rng.randrange(0, max(1, trials - 50))
        return f"{base}/trials?limit=50&offset={offset}&sort={rng.choice(sorts)}"

    return [
        ("study_list", study_list, False),
        ("trials_page", trials_page, False),
        ("trial_detail", lambda rng: f"{base}/trials/{rng.randrange(trials)}", False),
        ("trial_metrics", lambda rng: f"{base}/trials/{rng.randrange(trials)}/metrics", False),
        ("study_detail", lambda rng: base, False),
        ("study_metrics", study_metrics, False),
    ]


# -- main ----------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import sqlite3

    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def render_markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    c = result["config"]
    b = result["build"]
    w = result["writer"]
    s = result["summary"]
    lines = [
        "# API load benchmark (`bench/api_load.py`)",
        "",
        f"Run {result['started_at']} on {m['cpus']} CPU cores ({m['cpu_model']}), "
        f"{m['memory_gb']} GB RAM, {m['platform']}, Python {m['python']}, "
        f"SQLite {m['sqlite']}; load average at start {m['load_average_at_start']} "
        "(the machine is shared: other processes were running).",
        "",
        f"Database: {c['backend']}. uvicorn with {c['server_workers']} worker process(es) (the "
        "API), one writer process, and the load client (httpx, asyncio) all on the same cores. "
        "'server CPU ms/req' is the API processes' CPU time over the phase divided by its "
        "requests: the cost of a request, mostly independent of the machine's other load.",
        "",
        f"Data: a study of {b['trials']:,} trials and {b['metric_rows']:,} metric rows, plus "
        f"{b['filler_studies']} small finished studies. Building it: {b['api_sample_trials']} "
        f"trials through the StudyStore API took {b['api_sample_s']} s "
        f"({b['api_s_per_trial'] * 1000:.1f} ms per trial with its epochs: "
        f"~{b['api_extrapolated_s']:.0f} s for all), the other {b['bulk_trials']:,} by bulk "
        f"insert in {b['bulk_s']} s.",
        "",
        f"Writer: {w.get('writes', 0):,} writes ({w.get('trials', 0)} trials) during the run, "
        f"{w.get('errors', 0)} errors.",
        "",
        "| endpoint | clients | requests | req/s | p50 ms | p90 ms | p99 ms | max ms | KB/resp "
        "| server CPU ms/req | failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in result["endpoints"]:
        lines.append(
            f"| {e['name']} | {e['concurrency']} | {e['requests']} | {e['rps']} | {e['p50_ms']} "
            f"| {e['p90_ms']} | {e['p99_ms']} | {e['max_ms']} | {e['mean_kb']} "
            f"| {e['server_cpu_ms_per_request']} | {e['failures']} |"
        )
    lines += [
        "",
        f"Paginated endpoints ({', '.join(PAGINATED)}): {s['rps']} req/s, p50 {s['p50_ms']} ms, "
        f"p99 {s['p99_ms']} ms; target p99 < {c['target_ms']} ms: "
        f"{'met' if s['target_met'] else 'NOT met'}.",
        "",
        f"Command: `{result['command']}`",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--database-url", help="default: SQLite in a temporary directory")
    parser.add_argument("--trials", type=int, default=5000)
    parser.add_argument("--metrics", type=int, default=100_000, help="metric rows in all")
    parser.add_argument("--studies", type=int, default=60, help="small finished studies")
    parser.add_argument(
        "--api-sample", type=int, default=100, help="trials written via the store API"
    )
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per endpoint")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--server-workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument(
        "--heavy-concurrency", type=int, default=2, help="clients of heavy endpoints (none now)"
    )
    parser.add_argument("--max-requests", type=int, default=20_000, help="per endpoint")
    parser.add_argument(
        "--min-requests",
        type=int,
        default=1,
        help="per endpoint: a phase goes on past --duration until it has made this many",
    )
    parser.add_argument("--writer-pause", type=float, default=0.05, help="seconds between writes")
    parser.add_argument("--no-writer", action="store_true")
    parser.add_argument("--target-ms", type=float, default=100.0)
    parser.add_argument("--check-target", action="store_true", help="exit 1 if p99 > target")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="writes OUT.json and OUT.md (OUT as given)"
    )
    parser.add_argument("--smoke", action="store_true", help="a small, short run (CI)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-data", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials, args.metrics, args.studies, args.api_sample = 200, 2000, 5, 10
        args.duration, args.concurrency, args.max_requests = 1.5, 4, 2000
        args.min_requests = 20

    tmp = Path(tempfile.mkdtemp(prefix="stagetune-api-load-"))
    try:
        return _run(args, tmp)
    finally:
        if args.keep_data:
            print(f"data kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(args: argparse.Namespace, tmp: Path) -> int:
    url = args.database_url or f"sqlite:///{tmp / 'bench.db'}"
    backend = "PostgreSQL" if url.startswith("postgres") else "SQLite (WAL)"
    started_at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    info = machine()
    print(f"machine: {info}", flush=True)
    upgrade(url)
    with StudyStore(url) as store:
        if store.list_studies(limit=1).total:
            print(f"error: {url} is not empty; give an empty database", file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        study_id, build = build_data(
            store, args.trials, args.metrics, args.api_sample, args.studies
        )
        print(f"data built in {time.perf_counter() - t0:.1f} s: {asdict(build)}", flush=True)
        if backend == "PostgreSQL":
            # What autovacuum does within a minute or so of a bulk load: statistics for the
            # planner and the visibility map for index-only scans. VACUUM cannot run in a
            # transaction (and an ANALYZE in one that is rolled back leaves no statistics).
            autocommit = store.engine.execution_options(isolation_level="AUTOCOMMIT")
            with autocommit.connect() as conn:
                conn.execute(text("VACUUM ANALYZE"))
                info["postgresql"] = conn.execute(text("SHOW server_version")).scalar_one()

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    writer_file = tmp / "writer.json"
    writer = None
    if not args.no_writer:
        writer = ctx.Process(
            target=writer_main,
            args=(url, stop, str(writer_file), 20, args.writer_pause),
            name="bench-writer",
        )
        writer.start()
    results: list[EndpointResult] = []
    try:
        with api_server(url, tmp / "server.log", args.server_workers) as server:
            for name, make_path, heavy in endpoints(study_id, args.trials, args.studies + 2):
                concurrency = args.heavy_concurrency if heavy else args.concurrency
                duration = args.duration if not heavy else max(args.duration, 1.0)
                r = asyncio.run(
                    drive(
                        server,
                        name,
                        make_path,
                        duration,
                        concurrency,
                        args.max_requests,
                        args.seed,
                        args.min_requests,
                    )
                )
                results.append(r)
                print(
                    f"{name:14s} c={concurrency:<2d} n={r.requests:<6d} {r.rps:8.1f} req/s  "
                    f"p50 {r.p50_ms:7.1f} ms  p90 {r.p90_ms:7.1f} ms  p99 {r.p99_ms:7.1f} ms  "
                    f"max {r.max_ms:7.1f} ms  {r.mean_kb:8.1f} KB  "
                    f"server CPU {r.server_cpu_ms_per_request:6.1f} ms/req  failures {r.failures}"
                    + (f"  first: {r.first_failure}" if r.failures else ""),
                    flush=True,
                )
    finally:
        stop.set()
        if writer is not None:
            writer.join(60)
            if writer.is_alive():
                writer.terminate()
                writer.join(10)
    writer_stats: dict[str, Any] = {}
    if writer_file.exists():
        writer_stats = json.loads(writer_file.read_text())
        print(f"writer: {writer_stats}", flush=True)
    elif writer is not None:
        writer_stats = {"errors": 1, "first_error": f"writer exited with {writer.exitcode}"}

    # The summary of the paginated endpoints: pooled latencies are not kept, so the request-
    # weighted rps and the worst p50/p99 of the two are reported (conservative).
    paginated = [r for r in results if r.name in PAGINATED]
    total_requests = sum(r.requests for r in paginated)
    total_seconds = sum(r.seconds for r in paginated)
    summary = {
        "endpoints": list(PAGINATED),
        "rps": round(total_requests / total_seconds, 1) if total_seconds else 0.0,
        "p50_ms": max((r.p50_ms for r in paginated), default=0.0),
        "p99_ms": max((r.p99_ms for r in paginated), default=0.0),
    }
    summary["target_met"] = summary["p99_ms"] < args.target_ms
    failures = sum(r.failures for r in results) + int(writer_stats.get("errors", 0))
    result = {
        "started_at": started_at,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": info,
        "config": {
            "backend": backend,
            "trials": args.trials,
            "metrics": args.metrics,
            "studies": args.studies,
            "duration_s": args.duration,
            "min_requests": args.min_requests,
            "concurrency": args.concurrency,
            "server_workers": args.server_workers,
            "heavy_concurrency": args.heavy_concurrency,
            "writer": not args.no_writer,
            "writer_pause_s": args.writer_pause,
            "target_ms": args.target_ms,
            "smoke": args.smoke,
        },
        "build": asdict(build),
        "writer": writer_stats,
        "endpoints": [asdict(r) for r in results],
        "summary": summary,
        "failures": failures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    json_path = args.out.parent / f"{args.out.name}.json"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    (args.out.parent / f"{args.out.name}.md").write_text(render_markdown(result))
    print(
        f"api_load rps={summary['rps']} p50_ms={summary['p50_ms']} p99_ms={summary['p99_ms']}",
        flush=True,
    )
    if failures:
        print(f"error: {failures} failed requests or writes", file=sys.stderr)
        return 1
    if args.check_target and not summary["target_met"]:
        print(
            f"error: p99 {summary['p99_ms']} ms is over the {args.target_ms} ms target",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
