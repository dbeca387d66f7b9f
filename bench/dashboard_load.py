"""How fast the study page loads with 1,000 trials of ~30 epochs each.

Builds a finished study through the store API (1,000 trials: three baselines, then schedules
drawn from the real search space; most run all 30 epochs, the rest are ASHA-stopped at epochs
1/3/9/27, a few diverge or fail), with its Optuna study in the same database, serves it with
``create_app`` under uvicorn, and measures:

* ``html_data_s``: fetching the study page over HTTP (gzip, as a browser asks for it). The
  page embeds all its data (every trial row and learning curve), so this one request is
  everything the page needs to draw; median of the warm runs (the first, cold run is reported
  too);
* ``data_s``: the same data from the JSON endpoint the page polls while a study runs;
* ``importance_s``: the parameter importance endpoint (fANOVA on the Optuna study), cold;
* ``charts_s``: in headless Chromium, navigation start until every chart is drawn and the
  trial table is filled (when ``/usr/bin/chromium`` exists).

Usage: ``python bench/dashboard_load.py [--trials 1000] [--epochs 30] [--db PATH]``. With
``--db`` an existing database built by an earlier run is reused (building takes a few
minutes: one store transaction per epoch report). Results go to
``bench/results/dashboard_load.json`` and ``.md``; the last line printed is
``dashboard trials=N html_data_s=X``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

RESULTS = Path(__file__).resolve().parent / "results"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TRAIN_SIZE = 50_000
STUDY_NAME = "bench-1000"


class Clock:
    """The store's clock while building: the study ran over the last few hours."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def build(url: str, trials: int, epochs: int, seed: int = 0) -> int:
    """A finished study of ``trials`` trials through the store; returns its id."""
    import optuna

    from tuner.baselines import build_baselines
    from tuner.objectives import StudyObjective, TrialOutcome, summarize
    from tuner.space import ScheduleSpace
    from tuner.spec import StudySpec, TaskDefaults
    from tuner.store import StudyStore, TrialStatus
    from tuner.store.migrate import upgrade

    upgrade(url)
    spec = StudySpec.from_yaml(
        f"task: cifar10\ntask_options: {{data_dir: cifar-10-batches-py}}\nname: {STUDY_NAME}\n"
        f"schedule: {{total_epochs: {epochs}, base_lr: 0.1, base_batch_size: 64}}\n"
        "space: {batch_size: {min: 64, max: 4096}, stages: {min: 1, max: 4}}\n"
        f"budget: {{trials: {trials}}}\n"
    )
    space = ScheduleSpace.from_spec(
        spec.resolve(TaskDefaults(epochs=epochs, base_batch_size=64, base_lr=0.1))
    )
    rng = random.Random(seed)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler_study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed)
    )
    clock = Clock(datetime.now(UTC) - timedelta(hours=6))
    outcomes: list[TrialOutcome] = []
    with StudyStore(url, clock=clock) as store:
        study = store.create_study(spec.task, spec.to_dict(), trials, name=spec.name)
        claimed = store.claim_study("bench-worker", 3600)
        assert claimed is not None
        assert claimed.id == study.id
        baselines = build_baselines(space, TRAIN_SIZE)
        best: tuple[float, int] | None = None
        started = time.perf_counter()
        for number in range(trials):
            if number < len(baselines):
                schedule, baseline, params = baselines[number].schedule, baselines[number].name, {}
                otrial = None
            else:
                otrial = sampler_study.ask()
                schedule, baseline = space.sample(otrial), None
                params = dict(otrial.params)
            early = schedule.batch_size_at(0)
            final = 0.935 - 0.01 * math.log2(early / 64) + rng.gauss(0, 0.004)
            roll = rng.random()
            status, done = TrialStatus.COMPLETED, epochs
            if baseline is None and roll < 0.2:
                status, done = TrialStatus.STOPPED, rng.choice([1, 3, 9, 27])
                done = min(done, epochs - 1)
            elif baseline is None and roll < 0.23:
                status, done = TrialStatus.DIVERGED, rng.randint(1, 4)
            elif baseline is None and roll < 0.25:
                status, done = TrialStatus.FAILED, rng.randint(0, 2)
            record = store.create_trial(
                study.id, number, schedule.to_dict(), params, baseline=baseline
            )
            tau = 2.0 + 0.35 * math.log2(early / 32)
            steps = samples = 0
            wall = acc = 0.0
            for epoch in range(done):
                batch = schedule.batch_size_at(epoch)
                steps += TRAIN_SIZE // batch
                samples += (TRAIN_SIZE // batch) * batch
                seconds = TRAIN_SIZE / (9000 * batch / (batch + 192))
                wall += seconds
                clock.advance(seconds / 50)
                acc = max(0.1, final * (1 - 0.8 * math.exp(-(epoch + 1) / tau)))
                store.add_epoch_metrics(
                    record.id,
                    epoch,
                    {
                        "val_accuracy": acc,
                        "val_loss": 2.3 * (1 - acc) + 0.1,
                        "train_loss": 2.0 * (1 - acc),
                        "epoch_time_s": seconds,
                        "samples_per_s": samples / wall,
                        "steps": steps,
                        "samples": samples,
                        "batch_size": batch,
                        "lr": schedule.lr_at(epoch),
                        "wall_time_s": wall,
                    },
                )
            finished = status in (TrialStatus.COMPLETED, TrialStatus.STOPPED) and done > 0
            final_metrics: dict[str, Any] = {
                "steps": steps,
                "samples": samples,
                "wall_time_s": wall,
            }
            if steps:
                final_metrics["mean_batch_size"] = samples / steps
            if finished:
                final_metrics["val_accuracy"] = acc
                final_metrics["objective_values"] = {"val_accuracy": acc}
            reason = {
                TrialStatus.COMPLETED: f"trained all {epochs} epochs",
                TrialStatus.STOPPED: f"stopped early after {done} of {epochs} epochs",
                TrialStatus.DIVERGED: f"the loss became non-finite in epoch {done}",
                TrialStatus.FAILED: "the trial raised an error: RayActorError",
            }[status]
            stored = store.finish_trial(record.id, status, stop_reason=reason, final=final_metrics)
            if otrial is not None:  # as the engine tells Optuna
                if status is TrialStatus.STOPPED:
                    sampler_study.tell(otrial, state=optuna.trial.TrialState.PRUNED)
                elif status is TrialStatus.COMPLETED:
                    sampler_study.tell(otrial, acc)
                else:
                    sampler_study.tell(otrial, state=optuna.trial.TrialState.FAIL)
            if status is TrialStatus.COMPLETED and (best is None or acc > best[0]):
                best = (acc, number)
                store.set_best(study.id, record.id, acc)
            outcomes.append(
                TrialOutcome(
                    number=number,
                    baseline=baseline,
                    schedule=schedule.to_dict(),
                    status=status.value,
                    stop_reason=reason,
                    epochs_done=done,
                    val_accuracy=stored.val_accuracy,
                    metric_value=stored.val_accuracy,
                    steps=stored.steps,
                    samples=stored.samples,
                    wall_time_s=stored.wall_time_s,
                    values=(acc,) if finished else None,
                    summary=schedule.summary(),
                )
            )
            if (number + 1) % 100 == 0:
                rate = (number + 1) / (time.perf_counter() - started)
                print(f"  built {number + 1}/{trials} trials ({rate:.1f} trials/s)", flush=True)
        objective = StudyObjective.of(spec, epochs)
        optuna_name = f"stagetune-study-{study.id}"
        summary = summarize(outcomes, objective, extra={"optuna_study": optuna_name})
        store.finish_study(study.id, "completed", summary=summary, worker_id="bench-worker")
    storage = optuna.storages.RDBStorage(url)
    try:
        persisted = optuna.create_study(
            storage=storage, study_name=optuna_name, direction="maximize"
        )
        persisted.set_user_attr("stagetune_objective", ["val_accuracy"])
        persisted.add_trials(sampler_study.trials)
    finally:
        storage.engine.dispose()
    return study.id


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(url: str) -> Iterator[str]:
    """``create_app`` on the database under uvicorn in a thread; yields the base URL."""
    import uvicorn
    from pydantic import SecretStr

    from api.app import create_app
    from tuner.settings import Settings

    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        database_url=url,
        api_tokens=list[SecretStr](),
        api_token=None,
        protect_reads=False,
    )
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings=settings),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            ws="none",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def timed_get(client: httpx.Client, url: str) -> tuple[float, httpx.Response]:
    start = time.perf_counter()
    response = client.get(url)
    response.read()
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed, response


def browser_time(base: str, study_id: int, trials: int) -> dict[str, float] | None:
    """Navigation start to every chart drawn and the trial table filled (its first rows; it
    counts all of them), in Chromium."""
    if not CHROMIUM.exists():
        return None
    from playwright.sync_api import sync_playwright

    runs: list[dict[str, float]] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 1000})
            page = context.new_page()
            for _ in range(3):  # the first run fetches plotly.min.js; later ones have it cached
                page.goto(f"{base}/studies/{study_id}", wait_until="commit")
                page.wait_for_function(
                    """n => ['chart-curves', 'chart-cost', 'chart-schedule'].every(id => {
                           const el = document.getElementById(id);
                           return el && el.data && el.querySelector('.main-svg'); })
                       && document.querySelectorAll('#trials-body tr[data-number]').length > 0
                       && document.getElementById('trial-count').textContent === '(' + n + ')'""",
                    arg=trials,
                    timeout=60_000,
                )
                timing = page.evaluate(
                    """() => { const nav = performance.getEntriesByType('navigation')[0];
                         return {drawn: performance.now() / 1000,
                                 html: nav.responseEnd / 1000,
                                 dom: nav.domContentLoadedEventEnd / 1000}; }"""
                )
                runs.append({k: float(v) for k, v in timing.items()})
            context.close()
        finally:
            browser.close()
    return {
        "charts_cold_s": runs[0]["drawn"],
        "charts_s": statistics.median(r["drawn"] for r in runs[1:]),
        "html_in_browser_s": statistics.median(r["html"] for r in runs[1:]),
        "dom_ready_s": statistics.median(r["dom"] for r in runs[1:]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--runs", type=int, default=7, help="warm HTTP runs to take the median of")
    parser.add_argument("--db", type=Path, help="SQLite file to build (or reuse if it exists)")
    parser.add_argument("--no-browser", action="store_true", help="skip the Chromium timing")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    args = parser.parse_args(argv)

    from tuner.store import StudyStore

    tmp = None
    if args.db is None:
        tmp = tempfile.TemporaryDirectory(prefix="dashboard-bench-")
        args.db = Path(tmp.name) / "bench.db"
    url = f"sqlite:///{args.db.resolve()}"
    build_s = None
    if args.db.exists():
        with StudyStore(url) as store:
            found = [s for s in store.list_studies(limit=50).items if s.name == STUDY_NAME]
        if not found:
            raise SystemExit(f"{args.db} exists but holds no {STUDY_NAME} study; remove it")
        study_id = found[0].id
        print(f"reusing study {study_id} in {args.db}")
    else:
        print(f"building {args.trials} trials x {args.epochs} epochs in {args.db} ...", flush=True)
        start = time.perf_counter()
        study_id = build(url, args.trials, args.epochs)
        build_s = time.perf_counter() - start
        print(f"built in {build_s:.0f} s")

    with StudyStore(url) as store:
        study = store.get_study(study_id)
        n_trials = store.list_trials(study_id, limit=1).total
        rows = sum(len(c) for c in store.study_metrics(study_id).values())

    with (
        serve(url) as base,
        httpx.Client(headers={"Accept-Encoding": "gzip"}, timeout=120) as client,
    ):
        page_url = f"{base}/studies/{study_id}"
        cold_s, response = timed_get(client, page_url)
        html_bytes = len(response.content)
        wire_bytes = int(response.headers.get("content-length", html_bytes))
        html_runs = [timed_get(client, page_url)[0] for _ in range(args.runs)]
        data_url = f"{base}/dashboard/data/studies/{study_id}"
        data_runs = [timed_get(client, data_url)[0] for _ in range(args.runs)]
        importance_s, importance = timed_get(
            client, f"{base}/dashboard/data/studies/{study_id}/importance"
        )
        browser = None if args.no_browser else browser_time(base, study_id, n_trials)

    html_data_s = statistics.median(html_runs)
    result: dict[str, Any] = {
        "trials": n_trials,
        "epochs": args.epochs,
        "metric_rows": rows,
        "study_status": study.status.value,
        "html_data_s": round(html_data_s, 3),
        "html_data_cold_s": round(cold_s, 3),
        "html_data_max_s": round(max(html_runs), 3),
        "html_bytes": html_bytes,
        "html_gzip_bytes": wire_bytes,
        "data_s": round(statistics.median(data_runs), 3),
        "importance_s": round(importance_s, 3),
        "importance_available": importance.json().get("available"),
        "build_s": None if build_s is None else round(build_s, 1),
        "browser": None if browser is None else {k: round(v, 3) for k, v in browser.items()},
        "runs": args.runs,
        "machine": f"{platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, SQLite",
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
    }
    print(json.dumps(result, indent=2))
    if not args.no_save:
        save(result)
    if tmp is not None:
        tmp.cleanup()
    print(f"dashboard trials={n_trials} html_data_s={html_data_s:.3f}")
    return 0 if html_data_s < 2.0 else 1


def save(result: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "dashboard_load.json").write_text(json.dumps(result, indent=2) + "\n")
    b = result["browser"] or {}
    lines = [
        "# Dashboard load: study page with "
        f"{result['trials']:,} trials x {result['epochs']} epochs",
        "",
        f"`python bench/dashboard_load.py` on {result['date']} ({result['machine']}; the "
        "server, the client and Chromium share the machine's 2 CPU cores with other work: "
        f"load average {' / '.join(map(str, result['load_average']))} over 1 / 5 / 15 min "
        "at the end of the run). "
        f"{result['metric_rows']:,} per-epoch metric rows"
        + (
            f", built through the store in {result['build_s']:.0f} s"
            if result["build_s"] is not None
            else " (database built by an earlier run)"
        )
        + "; the study page embeds every trial row and learning curve, so one request is all "
        "it needs to draw.",
        "",
        "| what | time |",
        "|---|---|",
        f"| study page HTML with its data (median of {result['runs']} warm runs) "
        f"| **{result['html_data_s']:.3f} s** |",
        f"| same, first (cold) request | {result['html_data_cold_s']:.3f} s |",
        f"| same, slowest warm run | {result['html_data_max_s']:.3f} s |",
        f"| page size | {result['html_bytes'] / 1e6:.2f} MB, "
        f"{result['html_gzip_bytes'] / 1e6:.2f} MB gzip |",
        f"| data endpoint, all of it (polls while a study runs ask only for changes) "
        f"| {result['data_s']:.3f} s |",
        f"| parameter importance (PED-ANOVA over the Optuna study, first request) "
        f"| {result['importance_s']:.3f} s |",
    ]
    if b:
        lines += [
            f"| Chromium: navigation to all charts drawn and the trial table filled "
            f"| {b['charts_s']:.3f} s |",
            f"| Chromium: same, first visit (plotly.min.js not cached yet) "
            f"| {b['charts_cold_s']:.3f} s |",
            f"| Chromium: HTML received | {b['html_in_browser_s']:.3f} s |",
        ]
    lines += [
        "",
        f"`dashboard trials={result['trials']} html_data_s={result['html_data_s']:.3f}`",
        "",
    ]
    (RESULTS / "dashboard_load.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
