"""Run a stored study end to end: the composition of the engine, the trainable and the store.

* :func:`run_study` runs (or resumes) a study that a worker has claimed: it resolves the
  spec's defaults from the task, builds :class:`tuner.engine.TuningEngine` with
  :class:`workers.trainable.ScheduleTrainable`, persists every trial live
  (:class:`tuner.progress.StoreProgress`), stops on a cancel request, and finishes the study
  with its summary (the best schedule against each baseline).
* :func:`tune_spec` is the CLI's ``stagetune tune SPEC.yaml``: it creates the study in the
  given database (the embedded SQLite by default), runs it with a progress display, prints
  the result next to the baselines and writes the best schedule's YAML.

Resume: the Ray Tune experiment of study ``N`` lives in ``<ray storage>/study-N`` and its
Optuna study in the study database (``stagetune-study-N``). Calling :func:`run_study` again
for a study whose run was interrupted (process killed, worker lost and the study re-claimed)
restores both and continues: finished trials are kept, unfinished ones run again, and the
trial count ends at the budget. Without a restorable experiment directory (another host, or
one whose saved state a kill left unreadable: the engine renames it
``study-N.unreadable-<time>``) the study is finished from what the database holds. Do not call
``StudyStore.fail_running_trials`` before resuming: the trials it would fail are the ones the
resumed run continues.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from ray import tune
from rich.markup import escape

from tuner.engine import SEED_RUN_KEY, EngineResult, TuningEngine
from tuner.engine_search import PriorTrial, TrialMeta
from tuner.errors import (
    ClusterUnavailableError,
    InvalidStateError,
    NotFoundError,
    StagetuneError,
    ValidationError,
)
from tuner.export import export_yaml
from tuner.formatting import format_duration, format_metric, metric_kind
from tuner.noise_candidate import step_floor_of_epochs, step_floor_text
from tuner.objectives import (
    StudyObjective,
    TrialOutcome,
    ended_text,
    epochs_done,
    objective_label,
    outside_text,
    search_text,
    study_step_cap,
    trial_status,
)
from tuner.pbt import LINEAGE_KEY
from tuner.progress import StoreProgress, StudyWatch, outcome_of_record
from tuner.schedule import Schedule
from tuner.seeds import seed_text
from tuner.spec import ResolvedSpec, StudySpec, TaskDefaults
from tuner.store.records import StudyRecord, StudyStatus, TrialStatus, optuna_study_name
from tuner.store.records import experiment_name as store_experiment_name
from tuner.store.storage import StudyStore
from workers.console import stdout_console

__all__ = [
    "StudyResult",
    "TrialPrinter",
    "check_spec",
    "experiment_name",
    "optuna_study_name",
    "print_result",
    "resolve_spec",
    "resume_hint",
    "run_study",
    "tune_spec",
]

log = logging.getLogger(__name__)


def experiment_name(study: StudyRecord) -> str:
    """The study's Ray Tune experiment directory name
    (:func:`tuner.store.records.experiment_name`)."""
    return store_experiment_name(study.id, study.created_at)


@dataclass(frozen=True)
class StudyResult:
    """What a finished (or stopped) study run produced."""

    study_id: int
    status: StudyStatus
    summary: dict[str, Any]
    outcomes: tuple[TrialOutcome, ...]
    best_number: int | None
    best_is_baseline: bool
    best_schedule: Schedule | None
    schedule_path: Path | None = None

    @property
    def best(self) -> TrialOutcome | None:
        return next((o for o in self.outcomes if o.number == self.best_number), None)

    def no_result_reason(self) -> str | None:
        """Why the completed study has no result, with the trials' own reasons (the most
        common first); ``None`` if it has one, or if it did not complete (a cancel, a failure
        and a hand-back have their own messages)."""
        if (
            self.best_number is not None
            or not self.outcomes
            or self.status is not StudyStatus.COMPLETED
        ):
            return None
        reasons: dict[str, int] = {}
        for o in self.outcomes:
            reason = f"{o.status}: {o.stop_reason}" if o.stop_reason else o.status
            reasons[reason] = reasons.get(reason, 0) + 1
        ranked = sorted(reasons.items(), key=lambda kv: -kv[1])
        shown = "; ".join(f"{n}x {reason}" for reason, n in ranked[:3])
        more = f"; and {len(ranked) - 3} other reasons" if len(ranked) > 3 else ""
        return (
            f"study {self.study_id} has no result: none of its {len(self.outcomes)} trials "
            f"completed a run that counts ({shown}{more})"
        )


# --------------------------------------------------------------------------------------------
# Resolving a spec against its task
# --------------------------------------------------------------------------------------------


def resolve_spec(spec: StudySpec) -> tuple[ResolvedSpec, int]:
    """The spec with the task's defaults filled in, and the task's training-set size.

    Loads the task's data once in this process (cached) to learn its size: constraints on
    steps and mean batch size, and batch sizes larger than the dataset, are checked with it.
    The task's model is built and run on two samples (``check_model``): a model with the
    wrong output fails here, naming the task, not in every trial.
    """
    resolved, train_size, _, _ = _resolve_with_sizes(spec)
    return resolved, train_size


def _resolve_with_sizes(spec: StudySpec) -> tuple[ResolvedSpec, int, int, str | None]:
    """:func:`resolve_spec`, with the validation split's size too (from the same load) and
    the option that sets it (``None``: fixed): the study result says when the finalists
    differ by less than one run on a split this size can read
    (:func:`tuner.objectives.split_resolution`), and what to change."""
    from workers.tasks import get_task
    from workers.tasks.base import check_model

    task = get_task(spec.task)
    task.validate_options(spec.task_options)
    opt = task.default_optimizer
    defaults = TaskDefaults(
        epochs=task.default_epochs,
        base_batch_size=task.default_base_batch_size,
        base_lr=task.default_base_lr,
        optimizer=opt.name,
        momentum=opt.momentum,
        weight_decay=opt.weight_decay,
    )
    resolved = spec.resolve(defaults)
    data = task.load_data(spec.task_options, seed=spec.seed)
    check_model(task, spec.task_options, data)
    option = getattr(task.options_model, "val_size_option", None)
    return resolved, int(data.num_train), int(data.num_val), option


def _default_storage_path() -> Path:
    from tuner.settings import get_settings

    return get_settings().resolved_ray_storage_path


def _database_url(store: StudyStore) -> str:
    return store.url.render_as_string(hide_password=False)


# --------------------------------------------------------------------------------------------
# Running a study
# --------------------------------------------------------------------------------------------


def run_study(
    store: StudyStore,
    study_id: int,
    *,
    worker_id: str | None = None,
    trainable: type | None = None,
    storage_path: str | os.PathLike[str] | None = None,
    callbacks: Sequence[tune.Callback] = (),
    max_concurrent: int | None = None,
    trial_config: dict[str, Any] | None = None,
    poll_s: float = 2.0,
) -> StudyResult:
    """Run (or resume) the running study ``study_id`` to its end and finish it.

    The study must be ``running`` (claimed by ``worker_id`` through
    ``StudyStore.claim_study``; ``worker_id`` makes every poll a heartbeat). It ends
    ``completed`` with its summary, ``cancelled`` if a cancel was requested (with the summary
    of what ran), or ``failed`` with the error (which is re-raised). Interrupted
    (``KeyboardInterrupt``, or Tune's own Ctrl-C handling ending the experiment early), the
    study is released back to ``queued`` when ``worker_id`` owns it: a later run resumes it.
    If the study was taken over by another worker meanwhile, it is left to that worker. When
    Ray cannot be reached before the trials start (:class:`ClusterUnavailableError`), the
    study is released the same way and the error re-raised, saying so.
    """
    study = store.get_study(study_id)
    if study.status is not StudyStatus.RUNNING:
        raise InvalidStateError(
            f"study {study_id} is {study.status}; claim it first (StudyStore.claim_study)"
        )
    url = _database_url(store)
    watch = StudyWatch(url, study_id, worker_id=worker_id, poll_s=poll_s)
    try:
        spec = StudySpec.from_dict(study.spec)
        resolved, train_size, val_size, val_option = _resolve_with_sizes(spec)
        objective = StudyObjective.of(spec, resolved.total_epochs)
        if trainable is None:
            from workers.trainable import ScheduleTrainable

            trainable = ScheduleTrainable
        prior = _prior_trials(store, study_id, objective, train_size)
        engine = TuningEngine(
            resolved,
            trainable,
            storage_path=storage_path or _default_storage_path(),
            experiment_name=experiment_name(study),
            optuna_storage=url,
            optuna_study_name=optuna_study_name(study_id),
            train_size=train_size,
            val_size=val_size,
            val_size_option=val_option,
            callbacks=[StoreProgress(url, study_id, objective, train_size=train_size), *callbacks],
            seed_callbacks=callbacks,
            should_stop=watch,
            max_concurrent=max_concurrent,
            trial_config=trial_config,
            prior_trials=prior,
        )
        result = engine.run()
        prefixes = engine.prefix_store()
    except KeyboardInterrupt:
        _release(store, study_id, worker_id)
        raise
    except ClusterUnavailableError as exc:
        # Ray could not be reached before any trial ran: nothing of the study is lost, so it
        # goes back to the queue instead of failing (a dispatcher runs it once Ray is back).
        if worker_id is None:
            _fail(store, study_id, worker_id, exc)
            raise
        _release(store, study_id, worker_id, reason=f"not started: {exc}")
        raise ClusterUnavailableError(
            f"{exc}. Study {study_id} is queued again: a dispatcher (`stagetune worker`) runs "
            "it once Ray can be reached"
        ) from exc
    except Exception as exc:
        _fail(store, study_id, worker_id, exc)
        raise
    finally:
        watch.close()
    finished = _finish(store, study_id, worker_id, result)
    if prefixes is not None and finished.status is not StudyStatus.QUEUED:
        # The stage-boundary states serve forks and take-overs while the study runs; an
        # ended study needs none (its trials' results are in the database).
        prefixes.clear()
    return finished


def _prior_trials(
    store: StudyStore, study_id: int, objective: StudyObjective, train_size: int
) -> list[PriorTrial]:
    """The trials the database already holds for the study (it is resumed or taken over)."""
    out: list[PriorTrial] = []
    while True:
        page = store.list_trials(study_id, limit=1000, offset=len(out))
        for record in page.items:
            finished = record.status is not TrialStatus.RUNNING
            out.append(
                PriorTrial(
                    number=record.number,
                    baseline=record.baseline,
                    schedule=record.schedule,
                    params=record.params,
                    finished=finished,
                    outcome=outcome_of_record(record, objective, train_size) if finished else None,
                )
            )
        if not page.has_more:
            return out


def _release(
    store: StudyStore, study_id: int, worker_id: str | None, reason: str | None = None
) -> None:
    """Give the study back to the queue (when ``worker_id`` owns it), with ``reason`` kept in
    its ``error`` while it waits (``StudyStore.release_study``)."""
    if worker_id is None:
        return
    try:
        store.release_study(study_id, worker_id, reason)
    except StagetuneError as exc:
        log.warning("could not release study %s: %s", study_id, exc)


def _fail(store: StudyStore, study_id: int, worker_id: str | None, exc: BaseException) -> None:
    message = str(exc) if isinstance(exc, StagetuneError) else f"{type(exc).__name__}: {exc}"
    try:
        store.finish_study(study_id, StudyStatus.FAILED, error=message, worker_id=worker_id)
    except StagetuneError as inner:
        log.warning("could not mark study %s failed: %s", study_id, inner)


def _step_floor(
    store: StudyStore, study_id: int, spec: Mapping[str, Any], outcomes: Sequence[TrialOutcome]
) -> dict[str, Any] | None:
    """The small-batch baseline's step floor (tuner.noise_candidate.noise_scale_step_floor),
    with the study's step cap; ``None`` without that baseline or a noise-scale curve."""
    small = next((o for o in outcomes if o.baseline == "small_batch"), None)
    if small is None:
        return None
    try:
        trial = store.get_trial(study_id, small.number)
    except NotFoundError:
        return None
    floor = step_floor_of_epochs(store.trial_metrics(trial.id))
    if floor is None:
        return None
    return {"trial": small.number, **floor.to_dict(study_step_cap(spec))}


def _finish(
    store: StudyStore,
    study_id: int,
    worker_id: str | None,
    result: EngineResult,
) -> StudyResult:
    study = store.get_study(study_id)
    summary = {"study_id": study_id, "name": study.name, "task": study.task, **result.summary}
    summary["step_floor"] = _step_floor(store, study_id, study.spec, result.outcomes)
    best = result.summary.get("best")
    best_number = best["number"] if best else None
    owned = study.status is StudyStatus.RUNNING and (
        worker_id is None or study.worker_id == worker_id
    )
    if best_number is not None and owned:
        trial = store.get_trial(study_id, best_number)
        values = (trial.objective_values or {}).values()
        value = next((v for v in values if v is not None), None)
        seeds = best.get("seeds") if isinstance(best, dict) else None
        if isinstance(seeds, dict) and seeds.get("mean") is not None:
            value = float(seeds["mean"])  # a seed-robust pick is reported by its mean
        if value is not None:
            store.set_best(study_id, trial.id, value)
    if not owned:
        log.warning(
            "study %s is %s (worker %s); leaving it as it is",
            study_id,
            study.status,
            study.worker_id,
        )
        status = study.status
    elif study.cancel_requested:
        status = StudyStatus.CANCELLED
        store.finish_study(study_id, status, summary=summary, worker_id=worker_id)
    elif not result.complete:
        # Ended early without a cancel (Tune's own Ctrl-C handling): resumable.
        if worker_id is not None:
            store.release_study(study_id, worker_id)
            status = StudyStatus.QUEUED
            log.warning(
                "study %s stopped after %s of %s trials; it is queued again and a worker "
                "resumes it",
                study_id,
                len(result.outcomes),
                study.budget,
            )
        else:
            status = StudyStatus.FAILED
            store.finish_study(
                study_id,
                status,
                error=f"the experiment ended after {len(result.outcomes)} of {study.budget} trials",
                summary=summary,
            )
    else:
        status = StudyStatus.COMPLETED
        store.finish_study(study_id, status, summary=summary, worker_id=worker_id)
    return StudyResult(
        study_id=study_id,
        status=status,
        summary=summary,
        outcomes=result.outcomes,
        best_number=best_number,
        best_is_baseline=bool(result.summary.get("best_is_baseline")),
        best_schedule=result.best_schedule,
    )


def check_spec(spec: StudySpec) -> tuple[ResolvedSpec, int]:
    """Everything that can be checked before a study runs, with the task loaded: the task's
    options, the resolved settings, a non-empty search space, a constraint some schedule can
    meet, batches that fit the dataset and baselines that can run. Returns the resolved spec
    and the training-set size; raises :class:`ValidationError` saying what to change."""
    from tuner.baselines import build_baselines
    from tuner.space import ScheduleSpace, check_feasible

    resolved, train_size = resolve_spec(spec)
    space = ScheduleSpace.from_spec(resolved)
    check_feasible(space, spec.objective, train_size)
    if spec.baselines:
        build_baselines(space, train_size)
    return resolved, train_size


# --------------------------------------------------------------------------------------------
# The CLI's local run
# --------------------------------------------------------------------------------------------


def _claim(store: StudyStore, study_id: int, worker_id: str) -> None:
    """Claim exactly ``study_id`` (``claim_study`` hands out the oldest queued study, so
    others it returns first are given back at once)."""
    others: list[int] = []
    try:
        for _ in range(1000):
            claimed = store.claim_study(worker_id, stale_after_s=3600.0)
            if claimed is None:
                break
            if claimed.id == study_id:
                return
            others.append(claimed.id)
    finally:
        for other in others:
            store.release_study(other, worker_id)
    raise InvalidStateError(f"study {study_id} could not be claimed (it is not queued)")


def tune_spec(
    spec: StudySpec,
    database_url: str,
    out_path: str | os.PathLike[str],
    *,
    storage_path: str | os.PathLike[str] | None = None,
    trainable: type | None = None,
    console: Any = None,
    quiet: bool = False,
) -> StudyResult:
    """Create the study in ``database_url``, run it here with a progress display, print the
    result against the baselines and write the best schedule's YAML to ``out_path``.

    ``console`` is a ``rich.console.Console`` (default: stdout); ``quiet`` prints nothing.
    """
    out = stdout_console(quiet=quiet) if console is None else console
    resolved, _ = check_spec(spec)  # before creating the study (the data stays cached)
    store = StudyStore(database_url, create=True)
    try:
        study = store.create_study(spec.task, spec.to_dict(), spec.budget.trials, name=spec.name)
        worker_id = f"cli-{socket.gethostname()}-{os.getpid()}"
        _claim(store, study.id, worker_id)
        objective = StudyObjective.of(spec, resolved.total_epochs)
        label = objective_label(
            spec.objective.model_dump(mode="json"), objective.metric, objective.metric_direction
        )
        out.print(
            f"[bold]stagetune[/bold]: study {study.id} on task [cyan]{spec.task}[/cyan], "
            f"{spec.budget.trials} trials ({'3 baselines first; ' if spec.baselines else ''}"
            f"objective: {label})"
        )
        _quiet_ray_output()
        printer = TrialPrinter(budget=spec.budget.trials, objective=objective, quiet=quiet)
        result = run_study(
            store,
            study.id,
            worker_id=worker_id,
            trainable=trainable,
            storage_path=storage_path,
            callbacks=[printer],
        )
        path: Path | None = None
        # An interrupted study (queued again) has no result yet: its best so far is not
        # written where the result goes.
        if result.best_number is not None and result.status is not StudyStatus.QUEUED:
            record = store.get_study(study.id)
            trial = store.get_trial(study.id, result.best_number)
            path = Path(out_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(export_yaml(record, trial), encoding="utf-8")
        result = StudyResult(
            study_id=result.study_id,
            status=result.status,
            summary=result.summary,
            outcomes=result.outcomes,
            best_number=result.best_number,
            best_is_baseline=result.best_is_baseline,
            best_schedule=result.best_schedule,
            schedule_path=path,
        )
        print_result(result, out)
        if result.status is StudyStatus.QUEUED:
            hint = resume_hint(
                result.study_id, database_url, out_path, own_tasks=trainable is not None
            )
            # One unbroken line (no markup): the commands in it are copied as printed.
            out.print(hint, soft_wrap=True, markup=False, highlight=False)
        return result
    finally:
        store.close()


def resume_hint(
    study_id: int,
    database_url: str,
    out_path: str | os.PathLike[str],
    *,
    own_tasks: bool = False,
) -> str:
    """What a local user runs to finish an interrupted study (``stagetune tune`` stopped
    with Ctrl-C: the study is queued again with its finished trials kept) and write its
    schedule. The database's password is not printed. ``own_tasks``: the run trained tasks
    of a task file, which ``stagetune worker`` does not load."""
    import shlex

    if own_tasks:
        return (
            f"study {study_id} was interrupted and is queued, its finished trials kept; "
            "`stagetune worker` does not load a task file, so run `stagetune tune` again "
            "for a result (a new study)"
        )

    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(database_url)
        shown, secret = parsed.render_as_string(hide_password=True), bool(parsed.password)
    except Exception:  # not a URL SQLAlchemy parses: shown as given
        shown, secret = database_url, False
    out = shlex.quote(str(out_path))
    if secret:
        # Commands with the password hidden would not run: the URL goes in the environment.
        return (
            f"study {study_id} was interrupted and is queued, its finished trials kept; to finish "
            f"it, set STAGETUNE_DATABASE_URL to this database's URL with its password ({shown}), "
            "then run from this directory `stagetune worker --once` (it resumes the study "
            f"without training its finished trials again) and `stagetune export {study_id} -o "
            f"{out}`, which writes its schedule"
        )
    url = shlex.quote(shown)
    return (
        f"study {study_id} was interrupted and is queued, its finished trials kept; to finish "
        f"it, run from this directory `STAGETUNE_DATABASE_URL={url} stagetune worker --once` "
        "(it resumes the study without training its finished trials again), then "
        f"`stagetune export {study_id} --database-url {url} -o {out}` writes its schedule"
    )


def _quiet_ray_output() -> None:
    # Ray Tune's own console reporter and Optuna's INFO lines would interleave with ours.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("ray.tune").setLevel(logging.WARNING)


def _tag(text: str) -> str:
    """``[text]`` as literal text in a rich markup string (rich would read ``[tuned]`` as a
    style and print nothing)."""
    return escape(f"[{text}]")


class TrialPrinter(tune.Callback):
    """Prints a line when a trial starts and when it ends (the CLI's live progress), and the
    same for the finalists' seed runs."""

    def __init__(self, budget: int, objective: StudyObjective, quiet: bool = False) -> None:
        self.budget = budget
        self.objective = objective
        self.quiet = quiet
        self._done = 0
        self._seed_runs_done = 0
        self._seed_runs_started = False
        self._reserves_done = 0
        self._reserves_started = False
        self._console: Any = None
        # Trials started in this run (Tune id -> its lineage then): a resume is no new start.
        self._started: dict[str, list[Any]] = {}

    @property
    def console(self) -> Any:
        if self._console is None:
            self._console = stdout_console(quiet=self.quiet)
        return self._console

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        meta = TrialMeta.from_config(trial.config)
        if meta is None:
            return
        try:
            summary = Schedule.from_dict(trial.config["schedule"]).summary()
        except ValidationError:
            summary = "?"
        kind = meta.baseline or "tuned"
        lineage = list(trial.config.get(LINEAGE_KEY) or [])
        if trial.trial_id in self._started:
            # Resumed in this run: PBT pauses its population at each perturbation epoch, and
            # a trial in the worst quarter goes on from a better one's checkpoint.
            # A clone takes the donor's lineage and adds one entry: the lineage changes, but
            # it can be as long as before (a trial cloned twice from donors never cloned).
            if lineage and lineage != self._started[trial.trial_id]:
                epoch, donor = lineage[-1]
                self.console.print(
                    f"  [dim]clone[/dim] trial {meta.number:>3} {_tag(kind)} took trial "
                    f"{donor}'s state at epoch {epoch}: {escape(summary)}"
                )
            self._started[trial.trial_id] = lineage
            return
        self._started[trial.trial_id] = lineage
        seed_run = trial.config.get(SEED_RUN_KEY)
        if isinstance(seed_run, dict):
            if seed_run.get("reserve") and not self._reserves_started:
                self._reserves_started = True
                self.console.print(
                    "reserves: the pick's fresh seeds disagree; tuned schedules the search "
                    f"rated above its mean train on the same seeds ({seed_run.get('runs')} runs)"
                )
            elif not seed_run.get("reserve") and not self._seed_runs_started:
                self._seed_runs_started = True
                self.console.print(
                    f"seed runs: the finalists train again on {seed_run.get('seeds')} fresh "
                    f"seeds ({seed_run.get('runs')} runs); the result is picked on their means"
                )
            self.console.print(
                f"  [dim]start[/dim] trial {meta.number:>3} {_tag(kind)} on seed "
                f"{seed_run.get('seed')}: {escape(summary)}"
            )
            return
        self.console.print(
            f"  [dim]start[/dim] trial {meta.number:>3} {_tag(kind)} {escape(summary)}"
        )

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._started.pop(trial.trial_id, None)  # Tune runs it again from the start

    def _line(self, trial: Any, error: bool) -> None:
        meta = TrialMeta.from_config(trial.config)
        if meta is None:
            return
        r = trial.last_result or {}
        seed_run = trial.config.get(SEED_RUN_KEY)
        if isinstance(seed_run, dict):
            reserve = bool(seed_run.get("reserve"))
            done = self._reserves_done if reserve else self._seed_runs_done
            done += 1
            if reserve:
                self._reserves_done = done
            else:
                self._seed_runs_done = done
            status, _ = trial_status(self.objective, r, error=error)
            counter = f"{'reserve' if reserve else 'seed'} {done:>2}/{seed_run.get('runs')}"
            self.console.print(
                f"{_tag(counter)} trial {meta.number:>3} {_tag(meta.baseline or 'tuned')} seed "
                f"{seed_run.get('seed')} {status}: {self._metric_text(r)}, "
                f"{r.get('steps', '-')} steps"
            )
            return
        self._done += 1
        status, _ = trial_status(self.objective, r, error=error)
        forked = r.get("forked_epochs")
        fork_text = f", forked at epoch {forked}" if isinstance(forked, int) and forked else ""
        self.console.print(
            f"{_tag(f'{self._done:>3}/{self.budget}')} trial {meta.number:>3} "
            f"{_tag(meta.baseline or 'tuned')} {status}: {self._metric_text(r)} after "
            f"{epochs_done(r)} epoch(s), {r.get('steps', '-')} steps, "
            f"{format_duration(float(r.get('wall_time_s') or 0.0))}{fork_text}"
        )

    def _metric_text(self, result: Mapping[str, Any]) -> str:
        """``val_accuracy 0.9712``: the study's metric in a trial's last report."""
        metric = self.objective.metric
        return f"{metric} {format_metric(self.objective.metric_of(result), metric)}"

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._line(trial, error=False)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._line(trial, error=True)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_console"] = None
        return state


def _metric_cell(row: Mapping[str, Any], metric: str) -> str:
    """A result row's value of the study's metric (``metric_value``; a summary written before
    studies named their metric has ``val_accuracy``), as :func:`format_metric` writes it
    (without the dB the column heading carries)."""
    value = row.get("metric_value")
    if value is None:
        value = row.get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return format_metric(value, metric).removesuffix(" dB")


def _finalist_rows(result: StudyResult, shown: set[int]) -> list[tuple[dict[str, Any], str]]:
    """The finalists of the seed runs the table has no row for yet (a tuned trial that is
    neither the result nor a named candidate: the runner-up the note may call as good), with
    their search run's figures and their seed runs."""
    finalists = ((result.summary.get("seed_runs") or {}).get("finalists")) or []
    stats = {f["number"]: f for f in finalists if isinstance(f, Mapping)}
    rows = []
    for o in sorted(result.outcomes, key=lambda o: o.number):
        if o.number not in stats or o.number in shown:
            continue
        # the whole schedule's steps (a reserve's search run may have stopped early)
        steps = stats[o.number].get("steps")
        row = {
            "number": o.number,
            "schedule_summary": o.summary,
            "metric_value": o.metric_value,
            "steps": round(steps) if isinstance(steps, int | float) else o.steps,
            "wall_time_s": o.wall_time_s,
            "mean_batch_size": o.mean_batch_size,
            "seeds": stats[o.number],
        }
        notes = []
        if stats[o.number].get("reserve"):
            notes.append("reserve")
        if o.status != "completed":
            notes.append("stopped early")
        rows.append((row, "finalist" + (f" ({', '.join(notes)})" if notes else "")))
    return rows


def print_result(result: StudyResult, console: Any) -> None:
    """The result table: the best schedule next to the baselines."""
    from rich.table import Table

    summary = result.summary
    seeded = summary.get("seed_runs") or None
    written = summary.get("objective")
    metric = "val_accuracy"
    if isinstance(written, Mapping) and isinstance(written.get("metric"), str):
        metric = written["metric"]
    heading = "val_acc" if metric == "val_accuracy" else metric
    if metric_kind(metric) == "db":
        heading += " (dB)"
    table = Table(title=f"study {result.study_id}: {result.status}", show_lines=False)
    columns = ["trial", "kind", "schedule", heading, "steps", "wall time", "mean batch"]
    if seeded:
        columns[3] = f"{heading} (search run)"
        columns.insert(4, f"{heading} over {len(seeded['seeds'])} fresh seeds")
    for column in columns:
        table.add_column(column)

    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    rows = []
    best = summary.get("best")
    if best:
        rows.append((best, "best" + (" (baseline)" if summary.get("best_is_baseline") else "")))
    rows.extend((b, b["baseline"]) for b in summary.get("baselines", []))
    rows.extend((c, f"{c['candidate']} (tuned)") for c in summary.get("candidates") or [])
    rows.extend(_finalist_rows(result, {row["number"] for row, _ in rows}))
    objective_doc = written if isinstance(written, Mapping) else {}
    for row, kind in rows:
        # a baseline over the step cap, say; a recipe candidate ASHA stopped early
        notes = "; ".join(t for t in (outside_text(row, objective_doc), ended_text(row)) if t)
        if notes:  # "fitted_constant (tuned; stopped early ...)", "small_batch (1,560 steps, ...)"
            kind = f"{kind[:-1]}; {notes})" if kind.endswith(")") else f"{kind} ({notes})"
        cells = [  # a stop reason may hold brackets, which rich would read as markup
            str(row["number"]),
            escape(kind),
            escape(row.get("schedule_summary") or ""),
            _metric_cell(row, metric),
            fmt(row.get("steps"), "d"),
            format_duration(row.get("wall_time_s")),
            fmt(row.get("mean_batch_size"), ".0f"),
        ]
        if seeded:
            cells.insert(4, seed_text(row.get("seeds")))
        table.add_row(*cells)
    console.print(table)
    console.print(summary.get("note", ""), markup=False)
    search = search_text(summary)
    if search:
        console.print(search, soft_wrap=True, markup=False)  # one line (the terminal wraps it)
    floor = summary.get("step_floor")
    if isinstance(floor, Mapping):
        style = "yellow" if floor.get("cap_below_floor") else None
        text = step_floor_text(floor, int(floor["trial"]))
        console.print(text, style=style, soft_wrap=True, markup=False)
    if result.schedule_path is not None:
        console.print(f"best schedule written to [bold]{escape(str(result.schedule_path))}[/bold]")
