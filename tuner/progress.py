"""Live persistence of a running study: a Ray Tune callback that writes every trial to the
:class:`~tuner.store.StudyStore` as it happens, and the cancel/heartbeat watch.

:class:`StoreProgress` (a ``ray.tune.Callback``):

* ``on_trial_start``: the trial (number, schedule, Optuna params, baseline name) is created,
  or started again when a resumed experiment re-runs it (``start_trial``: the store counts
  the re-run in ``restarts``);
* ``on_trial_result``: the epoch's metrics (a replayed epoch replaces the earlier report);
* ``on_trial_complete`` / ``on_trial_error``: the trial is finished as ``completed`` (all
  epochs, or the target accuracy reached), ``stopped`` (ended early by ASHA or a cancel:
  fewer epochs than the run), ``diverged`` or ``failed`` (with the error), with its final
  metrics and objective values, and the study's best trial so far is updated. These writes
  are made at the end of the controller step, *after* Tune has saved its experiment state
  and that state has been copied to the experiment directory, so a trial the store shows
  finished is one a resumed experiment will not run again;
* ``on_experiment_end``: every trial Tune knows is reconciled with the store (a trial whose
  finish was not yet written when the previous run was killed is written now).

Both classes are pickled into the Tune experiment directory (and restored with it), so they
hold the database URL and open the store lazily.

:class:`StudyWatch` is what the engine polls to stop the experiment: every ``poll_s`` seconds
it heartbeats the study (when a worker owns it) and reads ``cancel_requested``; it also stops
the run if the study was taken over by another worker or is no longer running.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Any, Final

from ray import tune

from tuner.engine_search import TrialMeta
from tuner.errors import ConflictError, InvalidStateError, NotFoundError, StagetuneError
from tuner.objectives import (
    StudyObjective,
    TrialOutcome,
    epochs_done,
    failure_of,
    select_best,
    trial_status,
)
from tuner.pbt import LINEAGE_KEY
from tuner.schedule import Schedule
from tuner.space import violated_constraints
from tuner.store.records import TrialRecord, TrialStatus
from tuner.store.storage import StudyStore

__all__ = ["StoreProgress", "StudyWatch", "epoch_metrics", "outcome_of_record"]

log = logging.getLogger(__name__)

#: Keys Ray Tune adds to every result; not stored as epoch metrics.
TUNE_KEYS: Final = frozenset(
    {
        "config",
        "date",
        "done",
        "hostname",
        "node_ip",
        "pid",
        "time_this_iter_s",
        "time_total_s",
        "timestamp",
        "trial_id",
        "experiment_id",
        "experiment_tag",
        "iterations_since_restore",
        "time_since_restore",
        "timesteps_since_restore",
        "timesteps_total",
        "episodes_total",
        "checkpoint_dir_name",
        "should_checkpoint",
        "training_iteration",
        "warmup_time",
    }
)


def epoch_metrics(result: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """The (0-based) epoch and the metrics to store from one Tune result."""
    epoch = result.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        it = result.get("training_iteration")
        epoch = (it - 1) if isinstance(it, int) else 0
    metrics = {k: v for k, v in result.items() if k not in TUNE_KEYS}
    metrics["epoch"] = epoch
    return epoch, metrics


def _final(
    objective: StudyObjective, result: Mapping[str, Any], values: tuple[float, ...] | None
) -> dict[str, Any]:
    def num(key: str) -> float | None:
        value = result.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) if math.isfinite(float(value)) else None

    steps, samples = num("steps"), num("samples")
    done = epochs_done(result) if isinstance(result.get("training_iteration"), int) else None
    return {
        "val_accuracy": num("val_accuracy"),
        "val_loss": num("val_loss"),
        "metric_value": objective.metric_of(result),
        "wall_time_s": num("wall_time_s"),
        "steps": None if steps is None else int(steps),
        "samples": None if samples is None else int(samples),
        "mean_batch_size": samples / steps if steps and samples is not None else None,
        "epochs_done": done if isinstance(done, int) else None,
        "objective_values": objective.value_dict(values),
    }


def outcome_of_record(
    record: TrialRecord, objective: StudyObjective, train_size: int | None = None
) -> TrialOutcome:
    """A stored trial as a :class:`TrialOutcome` (for choosing the best trial so far)."""
    values: tuple[float, ...] | None = None
    stored = record.objective_values or {}
    picked = [stored.get(name) for name in objective.names]
    if all(isinstance(v, int | float) for v in picked):
        values = tuple(float(v) for v in picked if v is not None)
    violated: tuple[str, ...] = ()
    summary = ""
    try:
        schedule = Schedule.from_dict(record.schedule)
        summary = schedule.summary()
        if record.baseline is not None and train_size is not None:
            violated = violated_constraints(schedule, objective.spec, train_size)
    except StagetuneError:
        pass
    return TrialOutcome(
        number=record.number,
        baseline=record.baseline,
        schedule=record.schedule,
        status=record.status.value,
        stop_reason=record.stop_reason,
        epochs_done=record.epochs_done,
        val_accuracy=record.val_accuracy,
        metric_value=record.metric(objective.metric),
        steps=record.steps,
        samples=record.samples,
        wall_time_s=record.wall_time_s,
        values=values,
        feasible=not violated,
        violated=violated,
        summary=summary,
    )


class _LazyStore:
    """Holds a database URL and opens the store on first use (never pickled)."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._store: StudyStore | None = None

    @property
    def store(self) -> StudyStore:
        if self._store is None:
            self._store = StudyStore(self.database_url)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None
        return state


class StoreProgress(tune.Callback):
    """Persists a study's trials and per-epoch metrics as they happen (see the module doc)."""

    def __init__(
        self,
        database_url: str,
        study_id: int,
        objective: StudyObjective,
        *,
        train_size: int | None = None,
    ) -> None:
        self._db = _LazyStore(database_url)
        self.study_id = study_id
        self.objective = objective
        self.train_size = train_size
        self._ids: dict[str, int | None] = {}  # Tune trial id -> store trial id (None: skip)
        self._pending: list[tuple[str, dict[str, Any], bool, str | None]] = []
        # Trials started in this process, those Tune is retrying after an error, and the
        # schedule each was last stored with (PBT replaces a trial's schedule).
        self._seen: set[str] = set()
        self._recovering: set[str] = set()
        self._schedules: dict[str, dict[str, Any]] = {}

    @property
    def store(self) -> StudyStore:
        return self._db.store

    # ------------------------------------------------------------------ trials

    def _record_id(self, trial: Any, *, start: bool = False) -> int | None:
        if trial.trial_id in self._ids:
            return self._ids[trial.trial_id]
        meta = TrialMeta.from_config(trial.config)
        if meta is None:
            self._ids[trial.trial_id] = None
            return None
        params = dict(meta.params)
        if meta.optuna_trial is not None:
            params = {**params, "optuna_trial": meta.optuna_trial}
        if meta.candidate is not None:
            params = {**params, "candidate": meta.candidate}
        # A start (re-)runs a trial whose previous run cannot go on (``restarts`` + 1);
        # other look-ups only find the trial again.
        try:
            if start:
                record = self.store.start_trial(
                    self.study_id,
                    meta.number,
                    dict(trial.config.get("schedule") or {}),
                    params,
                    baseline=meta.baseline,
                    # A PBT trial's stored schedule is the lineage it grew; run again, it
                    # starts over from its first one.
                    reschedule=isinstance(trial.config.get(LINEAGE_KEY), list),
                )
            else:
                record = self.store.upsert_trial(
                    self.study_id,
                    meta.number,
                    dict(trial.config.get("schedule") or {}),
                    params,
                    baseline=meta.baseline,
                    any_schedule=isinstance(trial.config.get(LINEAGE_KEY), list),
                )
        except (ConflictError, InvalidStateError, NotFoundError) as exc:
            log.warning("not persisting trial %s: %s", meta.number, exc)
            self._ids[trial.trial_id] = None
            return None
        if record.status is not TrialStatus.RUNNING:
            # Finished in the store already (a resumed experiment runs it again because the
            # run was killed before Tune saved that it had finished): keep the stored result.
            log.info("trial %s is already %s; not recording its replay", meta.number, record.status)
            self._ids[trial.trial_id] = None
            return None
        self._ids[trial.trial_id] = record.id
        return record.id

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        resumed = trial.trial_id in self._seen and trial.trial_id not in self._recovering
        self._recovering.discard(trial.trial_id)
        self._seen.add(trial.trial_id)
        if resumed and self._ids.get(trial.trial_id) is not None:
            # Paused and resumed in this run (PBT pauses its population at each perturbation,
            # and a clone resumes from another trial's checkpoint): the same run goes on.
            self._store_schedule(trial)
            return
        self._ids.pop(trial.trial_id, None)  # a restarted trial is looked up again
        if self._record_id(trial, start=True) is not None:
            self._schedules[trial.trial_id] = dict(trial.config.get("schedule") or {})

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._recovering.add(trial.trial_id)  # Tune runs it again from scratch

    def _store_schedule(self, trial: Any) -> None:
        record_id = self._ids.get(trial.trial_id)
        schedule = trial.config.get("schedule")
        if record_id is None or not isinstance(schedule, dict):
            return
        if schedule == self._schedules.get(trial.trial_id):
            return
        # PBT replaced the trial's schedule (a clone, then a new stage): store its lineage,
        # and the epochs before the clone as those of the trial it cloned.
        donor_id, epoch = None, 0
        lineage = trial.config.get(LINEAGE_KEY)
        if lineage:
            epoch, donor_number = lineage[-1]
            donor = self.store.get_trial(self.study_id, int(donor_number))
            donor_id = donor.id if donor is not None else None
        try:
            self.store.set_trial_schedule(
                record_id, schedule, cloned_from=donor_id, clone_epoch=int(epoch)
            )
        except StagetuneError as exc:
            log.warning("could not update the schedule of trial %s: %s", trial, exc)
            return
        self._schedules[trial.trial_id] = dict(schedule)

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        record_id = self._record_id(trial)
        if record_id is None or failure_of(result) is not None:
            return  # a failure report ends an epoch that was not trained: no metrics to keep
        epoch, metrics = epoch_metrics(result)
        try:
            self.store.add_epoch_metrics(record_id, epoch, metrics)
        except (InvalidStateError, NotFoundError) as exc:
            log.warning("could not record epoch %s of trial %s: %s", epoch, trial.trial_id, exc)
        # After the epoch: PBT may have cloned another trial into this one on this very
        # result (schedulers decide before callbacks), replacing the epochs before the clone.
        self._store_schedule(trial)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._pending.append((trial.trial_id, dict(trial.last_result or {}), False, None))

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._pending.append(
            (trial.trial_id, dict(trial.last_result or {}), True, _error_message(trial))
        )

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if self._pending:
            self._flush({t.trial_id: t for t in trials})

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        by_id = {t.trial_id: t for t in trials}
        self._flush(by_id)
        # Reconcile: trials Tune finished whose finish the store has not seen.
        for trial in trials:
            if trial.status not in ("TERMINATED", "ERROR"):
                continue
            meta = TrialMeta.from_config(trial.config)
            if meta is None:
                continue
            try:
                record = self.store.get_trial(self.study_id, meta.number)
            except NotFoundError:
                self._ids.pop(trial.trial_id, None)
                if self._record_id(trial) is None:
                    continue
                record = self.store.get_trial(self.study_id, meta.number)
            if record.status is TrialStatus.RUNNING:
                self._ids[trial.trial_id] = record.id
                self._finish(trial, dict(trial.last_result or {}), trial.status == "ERROR", None)
        self._update_best()
        self._db.close()

    def _flush(self, trials_by_id: Mapping[str, Any]) -> None:
        if self._pending:
            _sync_experiment_state(trials_by_id.values())
        pending, self._pending = self._pending, []
        for trial_id, result, error, message in pending:
            trial = trials_by_id.get(trial_id)
            if trial is None:
                continue
            self._finish(trial, result, error, message)
        if pending:
            self._update_best()

    def _finish(self, trial: Any, result: dict[str, Any], error: bool, message: str | None) -> None:
        record_id = self._record_id(trial)
        if record_id is None:
            return
        status, reason = trial_status(self.objective, result, error=error)
        if status == "stopped" and self._cancel_requested():
            # Not ASHA: the study's cancel ended the run.
            total = self.objective.total_epochs
            reason = f"cancelled after {epochs_done(result)} of {total} epochs"
        if message:
            reason = f"{reason}: {message}"
        values = None if error else self.objective.values(result)
        try:
            self.store.finish_trial(
                record_id, status, stop_reason=reason, final=_final(self.objective, result, values)
            )
        except InvalidStateError as exc:
            log.info("trial %s: %s", trial.trial_id, exc)
        self._ids[trial.trial_id] = None  # finished: nothing more to record

    def _cancel_requested(self) -> bool:
        try:
            return self.store.get_study(self.study_id).cancel_requested
        except StagetuneError:
            return False

    def _update_best(self) -> None:
        try:
            records: list[TrialRecord] = []
            while True:
                page = self.store.list_trials(self.study_id, limit=1000, offset=len(records))
                records.extend(page.items)
                if not page.has_more:
                    break
            outcomes = [outcome_of_record(r, self.objective, self.train_size) for r in records]
            best, _ = select_best(outcomes, self.objective)
            if best is None or best.values is None:
                return
            record = next(r for r in records if r.number == best.number)
            self.store.set_best(self.study_id, record.id, best.values[0])
        except StagetuneError as exc:
            log.warning("could not update the best trial of study %s: %s", self.study_id, exc)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pending"] = []
        state["_ids"] = {}
        state["_seen"] = set()
        state["_recovering"] = set()
        state["_schedules"] = {}
        return state


class StudyWatch:
    """Polled by the engine: heartbeats the study and says whether to stop the experiment.

    With ``worker_id`` (a dispatcher's worker that claimed the study) each poll is a
    heartbeat, and a study taken over by another worker or no longer running stops the run
    too; without it, the study is only read. ``reason`` says why it stopped.
    """

    def __init__(
        self, database_url: str, study_id: int, *, worker_id: str | None = None, poll_s: float = 2.0
    ) -> None:
        self._db = _LazyStore(database_url)
        self.study_id = study_id
        self.worker_id = worker_id
        self.poll_s = poll_s
        self.reason: str | None = None
        self._last = -math.inf

    def __call__(self) -> bool:
        if self.reason is not None:
            return True
        now = time.monotonic()
        if now - self._last < self.poll_s:
            return False
        self._last = now
        try:
            if self.worker_id is not None:
                study = self._db.store.heartbeat(self.study_id, self.worker_id)
            else:
                study = self._db.store.get_study(self.study_id)
        except (ConflictError, InvalidStateError, NotFoundError) as exc:
            self.reason = str(exc)
            return True
        if study.cancel_requested:
            self.reason = "cancel requested"
            return True
        return False

    def close(self) -> None:
        """Close the store connection the polls opened (a later poll opens a new one)."""
        self._db.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["reason"] = None
        state["_last"] = -math.inf
        return state


def _error_message(trial: Any) -> str | None:
    """The last line of a failed trial's error (Tune writes it next to the trial's results
    before it calls ``on_trial_error``; the copy in the experiment directory comes later)."""
    try:
        path = trial.error_file
        if path and os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as fh:
                return _last_line(fh.read())
        error = trial.get_error()
        return None if error is None else _last_line(str(error))
    except Exception:  # the reason is a courtesy; the failed status is what matters
        return None


def _sync_experiment_state(trials: Any) -> None:
    """Wait until the experiment state Tune saved in this controller step has reached the
    experiment directory (Tune copies it there in a background thread, and skips a copy while
    the previous one runs), so that a trial the store shows finished is one a restored
    experiment knows is finished. Uses the syncer Tune's trials share with the controller;
    a no-op if this Ray version has none."""
    storage = next((getattr(t, "storage", None) for t in trials), None)
    syncer = getattr(storage, "syncer", None)
    if storage is None or syncer is None:
        return
    try:
        syncer.wait()
        syncer.sync_up(storage.experiment_driver_staging_path, storage.experiment_fs_path)
        syncer.wait()
    except Exception as exc:  # best effort: the store write must not fail the experiment
        log.debug("could not sync the experiment state before persisting: %s", exc)


def _last_line(text: str, limit: int = 500) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else text
    return line if len(line) <= limit else line[: limit - 3] + "..."
