"""``StudyStore``: studies, trials and per-epoch metrics in SQLite or PostgreSQL.

Modelled on Optuna's RDB storage: every method runs in its own session and transaction,
returns frozen records (:mod:`tuner.store.records`), and reports what a caller can act on as
a domain error (:mod:`tuner.errors`) rather than a SQLAlchemy exception.

State machines (anything else raises ``InvalidStateError``):

* study: ``queued -> running`` (:meth:`StudyStore.claim_study`), ``running -> completed |
  failed | cancelled`` (:meth:`StudyStore.finish_study`), ``queued -> cancelled``
  (:meth:`StudyStore.request_cancel`), ``running -> queued`` (:meth:`StudyStore.release_study`).
* trial: created ``running``; ``running -> completed | stopped | diverged | failed``
  (:meth:`StudyStore.finish_trial`, :meth:`StudyStore.fail_running_trials`). Trials are only
  created, and epoch metrics only recorded, while the study (resp. trial) is running.

Concurrency: state changes lock the row they change (``SELECT ... FOR UPDATE`` on
PostgreSQL; on SQLite every writing transaction starts with ``BEGIN IMMEDIATE``, which
serializes writers across processes), and claims are additionally guarded by an
``UPDATE ... WHERE status = <what we saw>`` checked by its row count.

Floats that are not finite (a diverged trial's NaN loss) are stored as ``NULL``, both in
columns and inside JSON, so both backends keep and sort the same values.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from numbers import Integral, Real
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    CursorResult,
    Engine,
    Executable,
    Result,
    and_,
    bindparam,
    delete,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker

from tuner.errors import ConflictError, InvalidStateError, NotFoundError, ValidationError
from tuner.schedule import schedule_summary
from tuner.store import migrate
from tuner.store.engine import (
    display_url,
    make_engine,
    normalize_url,
    read_engine,
    write_engine,
)
from tuner.store.models import (
    BASELINE_MAX,
    NAME_MAX,
    TASK_MAX,
    TRIAL_SORT_INDEXES,
    WORKER_ID_MAX,
    StudyLeftoversRow,
    StudyRow,
    TrialMetricRow,
    TrialRow,
    UTCDateTime,
)
from tuner.store.records import (
    FINISHED_STUDY_STATUSES,
    FINISHED_TRIAL_STATUSES,
    EpochMetrics,
    EpochOrigin,
    Page,
    StudyLeftovers,
    StudyRecord,
    StudyStatus,
    TrialCurve,
    TrialRecord,
    TrialStatus,
    experiment_name,
    optuna_study_names,
)

MAX_PAGE_SIZE = 1000

METRIC_FLOAT_KEYS = (
    "val_accuracy",
    "val_loss",
    "train_loss",
    "epoch_time_s",
    "samples_per_s",
    "lr",
    "noise_scale",
)
METRIC_INT_KEYS = ("steps", "samples", "batch_size")
"""Epoch-metric keys with their own column; any other key of a report goes to ``extra``."""

FINAL_FLOAT_KEYS = ("val_accuracy", "val_loss", "metric_value", "wall_time_s", "mean_batch_size")
FINAL_INT_KEYS = ("steps", "samples", "epochs_done")
FINAL_KEYS = (*FINAL_FLOAT_KEYS, *FINAL_INT_KEYS, "objective_values")
"""Keys :meth:`StudyStore.finish_trial` accepts in ``final``."""

TRIAL_SORT_KEYS = ("number", *TRIAL_SORT_INDEXES)
"""Sort keys of :meth:`StudyStore.list_trials`; prefix ``-`` for descending."""

RELEASED_REASON = "worker released the study"
"""The ``stop_reason`` of trials failed by :meth:`StudyStore.release_study`: the only failed
trials :meth:`StudyStore.start_trial` runs again (the resumed study re-runs them)."""

_CLAIM_RETRIES = 20
_STALE_CANCEL_ERROR = "cancelled: its worker stopped sending heartbeats while a cancel was pending"


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _rowcount(result: Result[Any]) -> int:
    return cast("CursorResult[Any]", result).rowcount


# -- input checking ---------------------------------------------------------------------


def _text(value: str) -> str:
    # PostgreSQL text cannot hold NUL; SQLite can. Keep both backends storing the same thing.
    return value.replace("\x00", "\ufffd")


def _optional_text(value: str | None, what: str, max_len: int | None = None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, not {type(value).__name__}")
    value = _text(value.strip())
    if not value:
        return None
    if max_len is not None and len(value) > max_len:
        raise ValidationError(f"{what} is {len(value)} characters long; at most {max_len} allowed")
    return value


def _required_text(value: str, what: str, max_len: int) -> str:
    text = _optional_text(value, what, max_len)
    if text is None:
        raise ValidationError(f"{what} must not be empty")
    return text


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral | Real):
        raise ValidationError(f"{what} must be an integer, not {value!r}")
    if isinstance(value, Integral):
        return int(value)
    number = float(value)
    if not number.is_integer():
        raise ValidationError(f"{what} must be an integer, not {value!r}")
    return int(number)


def _optional_int(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what)


def _optional_float(value: Any, what: str) -> float | None:
    """A float, with ``None`` for missing and for NaN / infinity."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValidationError(f"{what} must be a number, not {value!r}")
    number = float(value)
    return number if math.isfinite(number) else None


def _json(value: Any, path: str) -> Any:
    """``value`` as plain JSON (a private copy); non-finite floats become ``None``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationError(
                    f"{path} has the key {key!r}; JSON object keys must be strings"
                )
            out[_text(key)] = _json(item, f"{path}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [_json(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise ValidationError(
        f"{path} is a {type(value).__name__}, which cannot be stored as JSON; "
        "use numbers, strings, booleans, None, lists and mappings"
    )


def _json_object(value: Mapping[str, Any], what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValidationError(f"{what} must be a mapping, not {type(value).__name__}")
    return cast("dict[str, Any]", _json(value, what))


def _study_status(value: StudyStatus | str) -> StudyStatus:
    try:
        return StudyStatus(value)
    except ValueError:
        allowed = ", ".join(s.value for s in StudyStatus)
        raise ValidationError(f"unknown study status {value!r}; one of: {allowed}") from None


def _trial_status(value: TrialStatus | str) -> TrialStatus:
    try:
        return TrialStatus(value)
    except ValueError:
        allowed = ", ".join(s.value for s in TrialStatus)
        raise ValidationError(f"unknown trial status {value!r}; one of: {allowed}") from None


def _statuses(value: Any, parse: Callable[[Any], StudyStatus | TrialStatus]) -> list[str] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    return [parse(item).value for item in items]


def _page_bounds(limit: int, offset: int) -> tuple[int, int]:
    limit = _int(limit, "limit")
    offset = _int(offset, "offset")
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValidationError(f"limit must be between 1 and {MAX_PAGE_SIZE}, not {limit}")
    if offset < 0:
        raise ValidationError(f"offset must not be negative, not {offset}")
    return limit, offset


def _split_metrics(
    epoch: int, metrics: Mapping[str, Any]
) -> tuple[dict[str, float | int | None], dict[str, Any]]:
    if not isinstance(metrics, Mapping):
        raise ValidationError(f"metrics must be a mapping, not {type(metrics).__name__}")
    columns: dict[str, float | int | None] = {}
    for key in METRIC_FLOAT_KEYS:
        columns[key] = _optional_float(metrics.get(key), f"metric {key!r}")
    for key in METRIC_INT_KEYS:
        columns[key] = _optional_int(metrics.get(key), f"metric {key!r}")
    if "epoch" in metrics and _int(metrics["epoch"], "metric 'epoch'") != epoch:
        raise ValidationError(
            f"the report says epoch {metrics['epoch']!r} but was recorded as epoch {epoch}"
        )
    known = {*METRIC_FLOAT_KEYS, *METRIC_INT_KEYS, "epoch"}
    extra = _json_object({k: v for k, v in metrics.items() if k not in known}, "metrics")
    return columns, extra


# -- row -> record ------------------------------------------------------------------------


def _trial_record(row: TrialRow) -> TrialRecord:
    return _trial_record_of([getattr(row, c.key) for c in _TRIAL_COLUMNS])


_TRIAL_COLUMNS = (
    TrialRow.id,
    TrialRow.study_id,
    TrialRow.number,
    TrialRow.baseline,
    TrialRow.schedule,
    TrialRow.params,
    TrialRow.status,
    TrialRow.stop_reason,
    TrialRow.started_at,
    TrialRow.finished_at,
    TrialRow.epochs_done,
    TrialRow.val_accuracy,
    TrialRow.val_loss,
    TrialRow.steps,
    TrialRow.samples,
    TrialRow.wall_time_s,
    TrialRow.mean_batch_size,
    TrialRow.objective_values,
    TrialRow.restarts,
    TrialRow.restart_reason,
    TrialRow.schedule_summary,
    TrialRow.metric_value,
)
"""The columns of a :class:`TrialRecord`, in its field order (Core reads: no ORM objects)."""

_TRIAL_STATUS_INDEX = 6


def _trial_record_of(values: Sequence[Any]) -> TrialRecord:
    """A ``TrialRecord`` from a row of :data:`_TRIAL_COLUMNS` (in that order)."""
    values = list(values)
    values[_TRIAL_STATUS_INDEX] = TrialStatus(values[_TRIAL_STATUS_INDEX])
    return TrialRecord(*values)


def _can_rerun(row: TrialRow) -> bool:
    """Whether :meth:`StudyStore.start_trial` runs an existing trial again."""
    if row.status == TrialStatus.RUNNING:
        return True
    return row.status == TrialStatus.FAILED and row.stop_reason == RELEASED_REASON


_METRIC_COLUMNS = (
    TrialMetricRow.trial_id,
    TrialMetricRow.epoch,
    TrialMetricRow.val_accuracy,
    TrialMetricRow.val_loss,
    TrialMetricRow.train_loss,
    TrialMetricRow.epoch_time_s,
    TrialMetricRow.samples_per_s,
    TrialMetricRow.steps,
    TrialMetricRow.samples,
    TrialMetricRow.batch_size,
    TrialMetricRow.lr,
    TrialMetricRow.noise_scale,
    TrialMetricRow.extra,
)


def _metrics_record(values: Sequence[Any]) -> EpochMetrics:
    """An ``EpochMetrics`` from a row of :data:`_METRIC_COLUMNS` (in that order)."""
    return EpochMetrics(*values)


@functools.cache
def _study_query() -> Any:
    """A study with its trial counts and best trial number (built once: the aliases' column
    collections are costly to derive on every call)."""
    trials = TrialRow.__table__.alias("t")
    # All trials less the running ones: counting a study's index entries is about twice as
    # fast as testing each one's status (SQLite, 5,000 trials).
    total = (
        select(func.count()).select_from(trials).where(trials.c.study_id == StudyRow.id)
    ).scalar_subquery()
    running = (
        select(func.count())
        .select_from(trials)
        .where(trials.c.study_id == StudyRow.id, trials.c.status == TrialStatus.RUNNING)
        .scalar_subquery()
    )
    best = TrialRow.__table__.alias("best")
    best_number = select(best.c.number).where(best.c.id == StudyRow.best_trial_id).scalar_subquery()
    best_baseline = (
        select(best.c.baseline).where(best.c.id == StudyRow.best_trial_id).scalar_subquery()
    )
    return select(
        *StudyRow.__table__.c,
        total.label("trials_total"),
        running.label("trials_running"),
        best_number.label("best_trial_number"),
        best_baseline.label("best_trial_baseline"),
    )


@functools.cache
def _study_page_statements(
    by_status: bool, by_task: bool, by_owner: bool
) -> tuple[Executable, Executable]:
    """The count and the page of :meth:`StudyStore.list_studies`, built once per filter
    shape with bound parameters ``statuses``, ``task``, ``owner``, ``limit``, ``offset``."""
    where: list[ColumnElement[bool]] = []
    if by_status:
        where.append(StudyRow.status.in_(bindparam("statuses", expanding=True)))
    if by_task:
        where.append(StudyRow.task == bindparam("task"))
    if by_owner:
        where.append(StudyRow.owner == bindparam("owner"))
    count = select(func.count()).select_from(StudyRow).where(*where)
    page = (
        _study_query()
        .where(*where)
        .order_by(StudyRow.created_at.desc(), StudyRow.id.desc())
        .limit(bindparam("limit"))
        .offset(bindparam("offset"))
    )
    return count, page


# -- the store ------------------------------------------------------------------------------


class StudyStore:
    """Studies, trials and per-epoch metrics in one SQLite or PostgreSQL database.

    ``StudyStore(url)`` expects the schema to exist (``alembic upgrade head`` or
    :func:`tuner.store.migrate.upgrade`); ``StudyStore(url, create=True)`` upgrades it first,
    which is what the embedded SQLite default does on start. ``clock`` returns the current
    time as an aware datetime (tests pass a fake one). Close the store (or use it as a context
    manager) to release its connections. A store is safe to share between threads.
    """

    def __init__(
        self,
        url: str | URL,
        *,
        create: bool = False,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._url = normalize_url(url)
        self._clock = clock or _utcnow
        self._engine = make_engine(self._url)
        self._sqlite = self._url.get_backend_name() == "sqlite"
        self._reads = sessionmaker(read_engine(self._engine), expire_on_commit=False)
        self._writes = sessionmaker(write_engine(self._engine), expire_on_commit=False)
        if create:
            try:
                self.ensure_schema()
            except BaseException:
                self._engine.dispose()
                raise

    @classmethod
    def from_url(cls, url: str | URL, *, create: bool = False) -> StudyStore:
        return cls(url, create=create)

    @property
    def url(self) -> URL:
        return self._url

    @property
    def engine(self) -> Engine:
        """The store's engine (for health checks and tests; don't write through it)."""
        return self._engine

    def ensure_schema(self) -> None:
        """Create or upgrade the schema to the newest revision (idempotent, concurrency-safe)."""
        migrate.upgrade_engine(self._engine)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> StudyStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StudyStore({display_url(self._url)!r})"

    # -- plumbing ------------------------------------------------------------------------

    def _now(self) -> datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise ValueError("the store's clock must return timezone-aware datetimes")
        return now.astimezone(UTC)

    @contextmanager
    def _session(self, *, write: bool) -> Iterator[Session]:
        maker = self._writes if write else self._reads
        try:
            with maker.begin() as session:
                yield session
        except (OperationalError, ProgrammingError) as exc:
            if _missing_schema(exc):
                raise InvalidStateError(
                    f"the database {display_url(self._url)} has no stagetune schema (or an "
                    "old one); run `alembic upgrade head` with STAGETUNE_DATABASE_URL set, or "
                    "open the store with StudyStore(url, create=True)"
                ) from exc
            raise

    def _study_records(self, session: Session, *where: ColumnElement[bool]) -> list[StudyRecord]:
        # Core execution (no ORM objects): a record is built from the columns directly.
        rows = session.connection().execute(_study_query().where(*where)).all()
        return [self._study_record(row) for row in rows]

    @staticmethod
    def _study_record(row: Any) -> StudyRecord:
        """A record from a row of :func:`_study_query`."""
        return StudyRecord(
            id=row.id,
            name=row.name,
            owner=row.owner,
            task=row.task,
            spec=row.spec,
            status=StudyStatus(row.status),
            cancel_requested=row.cancel_requested,
            budget=row.budget,
            created_at=row.created_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            heartbeat_at=row.heartbeat_at,
            worker_id=row.worker_id,
            attempts=row.attempts,
            error=row.error,
            best_trial_id=row.best_trial_id,
            best_trial_number=row.best_trial_number,
            best_trial_baseline=row.best_trial_baseline,
            best_value=row.best_value,
            summary=row.summary,
            trials_done=row.trials_total - row.trials_running,
            trials_running=row.trials_running,
        )

    def _load_study(self, session: Session, study_id: int) -> StudyRecord:
        # Rows changed by Core UPDATEs in this session must be re-read, not taken from the
        # identity map.
        session.expire_all()
        records = self._study_records(session, StudyRow.id == study_id)
        if not records:
            raise NotFoundError(f"study {study_id} does not exist")
        return records[0]

    def _lock_study(
        self, session: Session, study_id: int, *, share: bool = False, delete: bool = False
    ) -> StudyRow:
        """Load and lock the study row. PostgreSQL: ``FOR SHARE`` (``share``), ``FOR UPDATE``
        (``delete``), else ``FOR NO KEY UPDATE``, which still lets trials be inserted (their
        foreign-key check only needs a key-share lock). SQLite: the write transaction's lock."""
        query = select(StudyRow).where(StudyRow.id == study_id)
        if share:
            query = query.with_for_update(read=True)
        elif delete:
            query = query.with_for_update()
        else:
            query = query.with_for_update(key_share=True)
        row = session.execute(query).scalar_one_or_none()
        if row is None:
            raise NotFoundError(f"study {study_id} does not exist")
        return row

    def _lock_trial(self, session: Session, trial_id: int) -> TrialRow:
        row = session.execute(
            select(TrialRow).where(TrialRow.id == trial_id).with_for_update()
        ).scalar_one_or_none()
        if row is None:
            raise NotFoundError(f"trial id {trial_id} does not exist")
        return row

    def _insert(self) -> Any:
        return sqlite.insert if self._sqlite else postgresql.insert

    # -- studies ---------------------------------------------------------------------------

    def create_study(
        self,
        task: str,
        spec: Mapping[str, Any],
        budget: int,
        *,
        name: str | None = None,
        owner: str | None = None,
    ) -> StudyRecord:
        """Queue a new study. ``spec`` is the validated study spec as plain JSON."""
        row = StudyRow(
            task=_required_text(task, "task", TASK_MAX),
            spec=_json_object(spec, "spec"),
            budget=_int(budget, "budget"),
            name=_optional_text(name, "name", NAME_MAX),
            owner=_optional_text(owner, "owner", NAME_MAX),
            status=StudyStatus.QUEUED.value,
            cancel_requested=False,
            attempts=0,
            created_at=self._now(),
        )
        if row.budget < 1:
            raise ValidationError(f"budget must be at least 1 trial, not {row.budget}")
        with self._session(write=True) as session:
            session.add(row)
            session.flush()
            return self._load_study(session, row.id)

    def get_study(self, study_id: int) -> StudyRecord:
        with self._session(write=False) as session:
            return self._load_study(session, study_id)

    def list_studies(
        self,
        *,
        status: StudyStatus | str | Iterable[StudyStatus | str] | None = None,
        task: str | None = None,
        owner: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> Page[StudyRecord]:
        """Studies, newest first, filtered by status (one or several), task and owner."""
        limit, offset = _page_bounds(limit, offset)
        statuses = _statuses(status, _study_status)
        params: dict[str, Any] = {"statuses": statuses, "task": task, "owner": owner}
        params = {k: v for k, v in params.items() if v is not None}
        count, page = _study_page_statements(*(k in params for k in ("statuses", "task", "owner")))
        with self._session(write=False) as session:
            conn = session.connection()
            total = conn.execute(count, params).scalar_one()
            rows = conn.execute(page, {**params, "limit": limit, "offset": offset}).all()
            items = tuple(self._study_record(row) for row in rows)
        return Page(items=items, total=total, limit=limit, offset=offset)

    def claim_study(self, worker_id: str, stale_after_s: float) -> StudyRecord | None:
        """Atomically give ``worker_id`` the next study to run, or ``None`` if there is none.

        Candidates, oldest first: queued studies, and running studies whose heartbeat is older
        than ``stale_after_s`` (their worker is presumed dead: the claim takes them over; the
        new worker should call :meth:`fail_running_trials` and resume). A stale study with a
        pending cancel is finished as cancelled instead of being handed out. The claimed study
        is ``running``, owned by ``worker_id``, with a fresh heartbeat and ``attempts`` + 1.
        """
        worker_id = _required_text(worker_id, "worker_id", WORKER_ID_MAX)
        stale = _optional_float(stale_after_s, "stale_after_s")
        if stale is None or stale <= 0:
            raise ValidationError(f"stale_after_s must be a positive number, not {stale_after_s}")
        for _ in range(_CLAIM_RETRIES):
            with self._session(write=True) as session:
                now = self._now()
                cutoff = now - timedelta(seconds=stale)
                candidate = session.execute(
                    select(
                        StudyRow.id,
                        StudyRow.status,
                        StudyRow.heartbeat_at,
                        StudyRow.worker_id,
                        StudyRow.cancel_requested,
                    )
                    .where(
                        or_(
                            StudyRow.status == StudyStatus.QUEUED,
                            and_(
                                StudyRow.status == StudyStatus.RUNNING,
                                or_(
                                    StudyRow.heartbeat_at.is_(None),
                                    StudyRow.heartbeat_at < cutoff,
                                ),
                            ),
                        )
                    )
                    .order_by(StudyRow.created_at, StudyRow.id)
                    .limit(1)
                    .with_for_update(skip_locked=True)
                ).first()
                if candidate is None:
                    return None
                guard: list[ColumnElement[bool]] = [
                    StudyRow.id == candidate.id,
                    StudyRow.status == candidate.status,
                ]
                if candidate.status == StudyStatus.RUNNING:
                    guard.append(
                        StudyRow.heartbeat_at.is_(None)
                        if candidate.heartbeat_at is None
                        else StudyRow.heartbeat_at == candidate.heartbeat_at
                    )
                if candidate.status == StudyStatus.RUNNING and candidate.cancel_requested:
                    self._finish_trials(session, candidate.id, StudyStatus.CANCELLED, None, now)
                    session.execute(
                        update(StudyRow)
                        .where(*guard)
                        .values(
                            status=StudyStatus.CANCELLED.value,
                            finished_at=now,
                            error=_STALE_CANCEL_ERROR,
                        )
                    )
                    continue
                claimed = session.execute(
                    update(StudyRow)
                    .where(*guard)
                    .values(
                        status=StudyStatus.RUNNING.value,
                        worker_id=worker_id,
                        heartbeat_at=now,
                        started_at=func.coalesce(
                            StudyRow.started_at, literal(now, type_=UTCDateTime())
                        ),
                        attempts=StudyRow.attempts + 1,
                        error=None,  # why an earlier claim gave it back: not news any more
                    )
                )
                if _rowcount(claimed) == 1:
                    return self._load_study(session, candidate.id)
        return None

    def _owned_running(self, session: Session, study_id: int, worker_id: str) -> StudyRow:
        row = self._lock_study(session, study_id)
        if row.status != StudyStatus.RUNNING:
            raise InvalidStateError(
                f"study {study_id} is {row.status}, not running; "
                f"worker {worker_id!r} must stop working on it"
            )
        if row.worker_id != worker_id:
            raise ConflictError(
                f"study {study_id} now belongs to worker {row.worker_id!r} (taken over after "
                f"missed heartbeats); worker {worker_id!r} must stop working on it"
            )
        return row

    def heartbeat(self, study_id: int, worker_id: str) -> StudyRecord:
        """Record that ``worker_id`` is still working on the study; returns the study, so the
        worker sees ``cancel_requested``. ``ConflictError`` if another worker took it over,
        ``InvalidStateError`` if it is no longer running."""
        with self._session(write=True) as session:
            row = self._owned_running(session, study_id, worker_id)
            row.heartbeat_at = self._now()
            session.flush()
            return self._load_study(session, study_id)

    def release_study(
        self, study_id: int, worker_id: str, reason: str | None = None
    ) -> StudyRecord:
        """Give a running study back (graceful worker shutdown): it becomes queued again, or
        cancelled if a cancel was requested. Running trials become failed ("worker released
        the study"). ``reason``: why the worker could not run it (Ray unreachable), kept in
        the queued study's ``error`` until its next claim (``None`` leaves no reason). Errors
        as :meth:`heartbeat`."""
        reason = _optional_text(reason, "reason")
        with self._session(write=True) as session:
            row = self._owned_running(session, study_id, worker_id)
            now = self._now()
            if row.cancel_requested:
                self._finish_trials(session, study_id, StudyStatus.CANCELLED, None, now)
                row.status = StudyStatus.CANCELLED.value
                row.finished_at = now
            else:
                self._fail_trials(session, study_id, RELEASED_REASON, now)
                row.status = StudyStatus.QUEUED.value
                row.error = reason
            row.worker_id = None
            row.heartbeat_at = None
            session.flush()
            return self._load_study(session, study_id)

    def request_cancel(self, study_id: int) -> StudyRecord:
        """Cancel a study: a queued one is cancelled at once; a running one gets
        ``cancel_requested=True`` and its worker stops it (idempotent). ``InvalidStateError``
        for a finished study."""
        with self._session(write=True) as session:
            row = self._lock_study(session, study_id)
            status = StudyStatus(row.status)
            if status is StudyStatus.QUEUED:
                row.status = StudyStatus.CANCELLED.value
                row.cancel_requested = True
                row.finished_at = self._now()
                row.error = None  # a reason it was given back earlier: no longer the point
            elif status is StudyStatus.RUNNING:
                row.cancel_requested = True
            else:
                raise InvalidStateError(
                    f"study {study_id} is already {status}; there is nothing to cancel"
                )
            session.flush()
            return self._load_study(session, study_id)

    def finish_study(
        self,
        study_id: int,
        status: StudyStatus | str,
        *,
        error: str | None = None,
        summary: Mapping[str, Any] | None = None,
        worker_id: str | None = None,
    ) -> StudyRecord:
        """Finish a running study as completed, failed or cancelled.

        Trials still running are closed too: ``stopped`` (completed / cancelled study) or
        ``failed`` with the study's error. With ``worker_id``, ``ConflictError`` unless that
        worker owns the study.
        """
        final = _study_status(status)
        if final not in FINISHED_STUDY_STATUSES:
            allowed = ", ".join(sorted(s.value for s in FINISHED_STUDY_STATUSES))
            raise ValidationError(f"a study finishes as one of {allowed}, not {final}")
        error_text = _optional_text(error, "error")
        summary_json = None if summary is None else _json_object(summary, "summary")
        with self._session(write=True) as session:
            row = self._lock_study(session, study_id)
            if row.status != StudyStatus.RUNNING:
                hint = (
                    "; cancel a queued study with request_cancel"
                    if row.status == StudyStatus.QUEUED
                    else ""
                )
                raise InvalidStateError(
                    f"study {study_id} is {row.status}; only a running study can be finished{hint}"
                )
            if worker_id is not None and row.worker_id != worker_id:
                raise ConflictError(
                    f"study {study_id} belongs to worker {row.worker_id!r}, "
                    f"not {worker_id!r}; only its owner can finish it"
                )
            now = self._now()
            self._finish_trials(session, study_id, final, error_text, now)
            row.status = final.value
            row.finished_at = now
            row.error = error_text
            if summary_json is not None:
                row.summary = summary_json
            session.flush()
            return self._load_study(session, study_id)

    def set_best(self, study_id: int, trial_id: int, value: float) -> StudyRecord:
        """Record the study's best trial so far and its objective value."""
        best_value = _optional_float(value, "value")
        if best_value is None:
            raise ValidationError(f"the best value must be a finite number, not {value!r}")
        with self._session(write=True) as session:
            row = self._lock_study(session, study_id)
            trial_study = session.execute(
                select(TrialRow.study_id).where(TrialRow.id == trial_id)
            ).scalar_one_or_none()
            if trial_study != study_id:
                raise NotFoundError(f"study {study_id} has no trial with id {trial_id}")
            row.best_trial_id = trial_id
            row.best_value = best_value
            session.flush()
            return self._load_study(session, study_id)

    def delete_study(self, study_id: int) -> None:
        """Delete a study with its trials and metrics. ``InvalidStateError`` while running.

        In the same transaction, what the study left outside its rows (its Ray Tune experiment
        files, its Optuna study) is recorded as :class:`StudyLeftovers` for a worker to remove
        (:meth:`study_leftovers`, :meth:`leftovers_removed`)."""
        with self._session(write=True) as session:
            row = self._lock_study(session, study_id, delete=True)
            if row.status == StudyStatus.RUNNING:
                raise InvalidStateError(
                    f"study {study_id} is running; cancel it first (`stagetune cancel "
                    f"{study_id}`, or POST /api/v1/studies/{study_id}/cancel) and delete it "
                    "once it has stopped"
                )
            session.add(
                StudyLeftoversRow(
                    study_id=study_id,
                    experiment=experiment_name(study_id, row.created_at),
                    optuna_studies=optuna_study_names(study_id, row.summary),
                    requested_at=self._now(),
                    started_at=row.started_at,
                    attempts=0,
                )
            )
            session.execute(delete(StudyRow).where(StudyRow.id == study_id))

    # -- what deleted studies left behind --------------------------------------------------

    def study_leftovers(
        self, limit: int = 100, *, study_id: int | None = None
    ) -> list[StudyLeftovers]:
        """What deleted studies (or the deleted study ``study_id``) left behind that no worker
        has removed yet, oldest first."""
        limit, _ = _page_bounds(limit, 0)
        query = select(StudyLeftoversRow)
        if study_id is not None:
            query = query.where(StudyLeftoversRow.study_id == _int(study_id, "study_id"))
        with self._session(write=False) as session:
            rows = session.execute(
                query.order_by(StudyLeftoversRow.requested_at, StudyLeftoversRow.id).limit(limit)
            ).scalars()
            return [
                StudyLeftovers(
                    id=row.id,
                    study_id=row.study_id,
                    experiment=row.experiment,
                    optuna_studies=tuple(row.optuna_studies),
                    requested_at=row.requested_at,
                    attempts=row.attempts,
                    error=row.error,
                    started_at=row.started_at,
                )
                for row in rows
            ]

    def leftovers_removed(self, leftovers_id: int) -> None:
        """Forget a deleted study's leftovers: a worker has removed them (also when another
        worker did so first)."""
        with self._session(write=True) as session:
            session.execute(delete(StudyLeftoversRow).where(StudyLeftoversRow.id == leftovers_id))

    def leftovers_not_removed(self, leftovers_id: int, error: str) -> None:
        """Record that removing a deleted study's leftovers left something behind, and why (a
        worker tries again at its next look)."""
        with self._session(write=True) as session:
            session.execute(
                update(StudyLeftoversRow)
                .where(StudyLeftoversRow.id == leftovers_id)
                .values(attempts=StudyLeftoversRow.attempts + 1, error=_text(error))
            )

    # -- trials ----------------------------------------------------------------------------

    def _finish_trials(
        self,
        session: Session,
        study_id: int,
        study_status: StudyStatus,
        error: str | None,
        now: datetime,
    ) -> int:
        if study_status is StudyStatus.FAILED:
            return self._fail_trials(session, study_id, error or "study failed", now)
        reason = "study cancelled" if study_status is StudyStatus.CANCELLED else "study finished"
        result = session.execute(
            update(TrialRow)
            .where(TrialRow.study_id == study_id, TrialRow.status == TrialStatus.RUNNING)
            .values(status=TrialStatus.STOPPED.value, stop_reason=reason, finished_at=now)
        )
        return _rowcount(result)

    def _fail_trials(self, session: Session, study_id: int, reason: str, now: datetime) -> int:
        result = session.execute(
            update(TrialRow)
            .where(TrialRow.study_id == study_id, TrialRow.status == TrialStatus.RUNNING)
            .values(status=TrialStatus.FAILED.value, stop_reason=reason, finished_at=now)
        )
        return _rowcount(result)

    def _new_trial(
        self,
        study_id: int,
        number: int,
        schedule: Mapping[str, Any],
        params: Mapping[str, Any],
        baseline: str | None,
    ) -> TrialRow:
        number = _int(number, "trial number")
        if number < 0:
            raise ValidationError(f"trial number must not be negative, not {number}")
        document = _json_object(schedule, "schedule")
        return TrialRow(
            study_id=study_id,
            number=number,
            baseline=_optional_text(baseline, "baseline", BASELINE_MAX),
            schedule=document,
            params=_json_object(params, "params"),
            status=TrialStatus.RUNNING.value,
            epochs_done=0,
            schedule_summary=schedule_summary(document),
            restarts=0,
        )

    def _find_trial(self, session: Session, study_id: int, number: int) -> TrialRow | None:
        return session.execute(
            select(TrialRow).where(TrialRow.study_id == study_id, TrialRow.number == number)
        ).scalar_one_or_none()

    def _insert_trial(self, session: Session, row: TrialRow) -> TrialRecord:
        study = self._lock_study(session, row.study_id, share=True)
        if study.status != StudyStatus.RUNNING:
            raise InvalidStateError(
                f"study {row.study_id} is {study.status}; trials can only be added to a "
                "running study"
            )
        if self._find_trial(session, row.study_id, row.number) is not None:
            raise ConflictError(f"study {row.study_id} already has a trial number {row.number}")
        row.started_at = self._now()
        session.add(row)
        session.flush()
        return _trial_record(row)

    def create_trial(
        self,
        study_id: int,
        number: int,
        schedule: Mapping[str, Any],
        params: Mapping[str, Any],
        *,
        baseline: str | None = None,
    ) -> TrialRecord:
        """Start trial ``number`` of a running study. ``ConflictError`` if the number exists."""
        row = self._new_trial(study_id, number, schedule, params, baseline)
        try:
            with self._session(write=True) as session:
                return self._insert_trial(session, row)
        except IntegrityError as exc:  # a concurrent create of the same number won
            raise ConflictError(f"study {study_id} already has a trial number {number}") from exc

    def upsert_trial(
        self,
        study_id: int,
        number: int,
        schedule: Mapping[str, Any],
        params: Mapping[str, Any],
        *,
        baseline: str | None = None,
        any_schedule: bool = False,
    ) -> TrialRecord:
        """Idempotent :meth:`create_trial` (for resuming): returns the existing trial if it has
        the same schedule (any, with ``any_schedule``: a PBT trial's grows), params and
        baseline (whatever its status), ``ConflictError`` if it differs, else creates it."""
        row = self._new_trial(study_id, number, schedule, params, baseline)
        return self._insert_or(
            row, lambda _, existing: _trial_record(existing), same_schedule=not any_schedule
        )

    def start_trial(
        self,
        study_id: int,
        number: int,
        schedule: Mapping[str, Any],
        params: Mapping[str, Any],
        *,
        baseline: str | None = None,
        reschedule: bool = False,
    ) -> TrialRecord:
        """Record that trial ``number`` starts: :meth:`create_trial` for a new number, and a
        re-run of an existing trial with the same schedule, params and baseline when its
        previous run cannot go on (``ConflictError`` if they differ; with ``reschedule``, a
        PBT trial, whose stored schedule is the lineage it had grown, the re-run starts over
        from ``schedule``):

        * a ``running`` trial (its previous run never finished: the study was resumed after
          its worker was lost or taken over, or Tune retries it after an error), or a
          ``failed`` one whose worker released the study (:data:`RELEASED_REASON`), is
          running again from scratch: ``restarts`` + 1, ``restart_reason`` says what became
          of the previous run, its epoch metrics and final values are cleared and
          ``started_at`` is now. The study must be running (``InvalidStateError``);
        * any other finished trial is returned unchanged (a replay of a finished trial is
          not recorded).
        """
        row = self._new_trial(study_id, number, schedule, params, baseline)

        def rerun(session: Session, existing: TrialRow) -> TrialRecord:
            if not _can_rerun(existing):
                return _trial_record(existing)
            return self._restart_trial(session, existing, schedule=row if reschedule else None)

        return self._insert_or(row, rerun, same_schedule=not reschedule)

    def _insert_or(
        self,
        row: TrialRow,
        on_existing: Callable[[Session, TrialRow], TrialRecord],
        *,
        same_schedule: bool = True,
    ) -> TrialRecord:
        """Insert the new trial ``row``, or, if its number exists with the same schedule
        (unless not ``same_schedule``), params and baseline (``ConflictError`` if not),
        ``on_existing(session, existing)``."""
        for _ in range(2):
            try:
                with self._session(write=True) as session:
                    existing = self._find_trial(session, row.study_id, row.number)
                    if existing is None:
                        return self._insert_trial(session, row)
                    self._check_same_trial(existing, row, schedule=same_schedule)
                    return on_existing(session, existing)
            except IntegrityError:  # lost a race with a concurrent insert: read it back
                continue
        raise ConflictError(f"study {row.study_id} already has a trial number {row.number}")

    def _restart_trial(
        self, session: Session, existing: TrialRow, *, schedule: TrialRow | None = None
    ) -> TrialRecord:
        study = self._lock_study(session, existing.study_id, share=True)
        if study.status != StudyStatus.RUNNING:
            raise InvalidStateError(
                f"study {existing.study_id} is {study.status}; trials can only be started "
                "again in a running study"
            )
        session.refresh(existing, with_for_update=True)  # changed since it was read?
        row = existing
        if not _can_rerun(row):
            return _trial_record(row)
        started = row.started_at.isoformat().replace("+00:00", "Z")
        if row.status == TrialStatus.RUNNING:
            previous = f"previous run (started {started}) did not finish"
        else:
            previous = f"previous run (started {started}) failed: {row.stop_reason}"
        session.execute(delete(TrialMetricRow).where(TrialMetricRow.trial_id == row.id))
        row.status = TrialStatus.RUNNING.value
        row.restarts += 1
        row.restart_reason = f"{previous}; started again on claim {study.attempts} of the study"
        row.started_at = self._now()
        row.stop_reason = None
        row.finished_at = None
        row.epochs_done = 0
        if schedule is not None:  # a PBT trial starts over from its own first schedule
            row.schedule = schedule.schedule
            row.schedule_summary = schedule.schedule_summary
        for key in (*FINAL_FLOAT_KEYS, "steps", "samples", "objective_values"):
            setattr(row, key, None)
        session.flush()
        return _trial_record(row)

    @staticmethod
    def _check_same_trial(existing: TrialRow, row: TrialRow, *, schedule: bool = True) -> None:
        same = (
            (existing.schedule == row.schedule or not schedule)
            and existing.params == row.params
            and existing.baseline == row.baseline
        )
        if not same:
            raise ConflictError(
                f"study {row.study_id} already has a trial number {row.number} with a "
                "different schedule, params or baseline"
            )

    def set_trial_schedule(
        self,
        trial_id: int,
        schedule: dict[str, Any],
        *,
        cloned_from: int | None = None,
        clone_epoch: int = 0,
    ) -> TrialRecord:
        """Replace a running trial's schedule (a PBT trial that cloned another's weights and
        went on with a perturbed schedule: its schedule is its lineage).

        ``cloned_from`` (a trial id of the same study): the trial's epochs before
        ``clone_epoch`` become a copy of that trial's, so that its curve is its lineage's.
        """
        document = _json_object(schedule, "schedule")
        summary = schedule_summary(document)
        clone_epoch = _int(clone_epoch, "clone_epoch")
        with self._session(write=True) as session:
            row = self._lock_trial(session, trial_id)
            row.schedule = document
            row.schedule_summary = summary
            if cloned_from is not None and clone_epoch > 0:
                donor = session.get(TrialRow, cloned_from)
                if donor is None or donor.study_id != row.study_id:
                    raise NotFoundError(
                        f"trial id {cloned_from} is not a trial of study {row.study_id}"
                    )
                session.execute(
                    delete(TrialMetricRow).where(
                        TrialMetricRow.trial_id == trial_id, TrialMetricRow.epoch < clone_epoch
                    )
                )
                copied = session.scalars(
                    select(TrialMetricRow).where(
                        TrialMetricRow.trial_id == cloned_from,
                        TrialMetricRow.epoch < clone_epoch,
                    )
                ).all()
                for metric in copied:
                    values = {c.key: getattr(metric, c.key) for c in _METRIC_COLUMNS}
                    values["trial_id"] = trial_id
                    # Which trial trained the epoch (the donor's own clones keep theirs).
                    values["extra"] = {
                        **(metric.extra or {}),
                        "cloned_from": (metric.extra or {}).get("cloned_from", donor.number),
                    }
                    session.add(TrialMetricRow(**values))
                session.flush()
                row.epochs_done = session.execute(
                    select(func.count())
                    .select_from(TrialMetricRow)
                    .where(TrialMetricRow.trial_id == trial_id)
                ).scalar_one()
            session.flush()
            return _trial_record(row)

    def next_trial_number(self, study_id: int) -> int:
        """One more than the highest trial number of the study (0 for a study without trials)."""
        with self._session(write=False) as session:
            self._require_study(session, study_id)
            highest = session.execute(
                select(func.max(TrialRow.number)).where(TrialRow.study_id == study_id)
            ).scalar_one()
        return 0 if highest is None else int(highest) + 1

    def add_epoch_metrics(
        self, trial_id: int, epoch: int, metrics: Mapping[str, Any]
    ) -> EpochMetrics:
        """Record one epoch's metrics of a running trial; a replayed report of the same epoch
        replaces the earlier one (never a duplicate). Keys with a column (see
        :data:`METRIC_FLOAT_KEYS`, :data:`METRIC_INT_KEYS`) are stored there, others in
        ``extra``; a key ``epoch`` must match ``epoch``."""
        epoch = _int(epoch, "epoch")
        if epoch < 0:
            raise ValidationError(f"epoch must not be negative, not {epoch}")
        columns, extra = _split_metrics(epoch, metrics)
        with self._session(write=True) as session:
            trial = self._lock_trial(session, trial_id)
            if trial.status != TrialStatus.RUNNING:
                raise InvalidStateError(
                    f"trial {trial.number} of study {trial.study_id} is {trial.status}; "
                    "metrics can only be recorded while it runs"
                )
            values = {"trial_id": trial_id, "epoch": epoch, **columns, "extra": extra}
            insert = self._insert()(TrialMetricRow).values(**values)
            session.execute(
                insert.on_conflict_do_update(
                    index_elements=[TrialMetricRow.trial_id, TrialMetricRow.epoch],
                    set_={key: insert.excluded[key] for key in (*columns, "extra")},
                )
            )
            trial.epochs_done = session.execute(
                select(func.count())
                .select_from(TrialMetricRow)
                .where(TrialMetricRow.trial_id == trial_id)
            ).scalar_one()
        return _metrics_record([values[c.key] for c in _METRIC_COLUMNS])

    def finish_trial(
        self,
        trial_id: int,
        status: TrialStatus | str,
        *,
        stop_reason: str | None = None,
        final: Mapping[str, Any] | None = None,
    ) -> TrialRecord:
        """Finish a running trial as completed, stopped, diverged or failed, with its final
        metrics (keys: :data:`FINAL_KEYS`; ``objective_values`` maps objective names to
        numbers). ``epochs_done`` defaults to the number of epochs with metrics."""
        end = _trial_status(status)
        if end not in FINISHED_TRIAL_STATUSES:
            allowed = ", ".join(sorted(s.value for s in FINISHED_TRIAL_STATUSES))
            raise ValidationError(f"a trial finishes as one of {allowed}, not {end}")
        final = {} if final is None else final
        if not isinstance(final, Mapping):
            raise ValidationError(f"final must be a mapping, not {type(final).__name__}")
        unknown = sorted(set(final) - set(FINAL_KEYS))
        if unknown:
            raise ValidationError(
                f"unknown final metric(s) {', '.join(map(repr, unknown))}; "
                f"allowed: {', '.join(FINAL_KEYS)}"
            )
        values: dict[str, Any] = {}
        for key in FINAL_FLOAT_KEYS:
            if key in final:
                values[key] = _optional_float(final[key], f"final {key!r}")
        for key in FINAL_INT_KEYS:
            if key in final:
                values[key] = _optional_int(final[key], f"final {key!r}")
        if final.get("objective_values") is not None:
            objectives = _json_object(final["objective_values"], "objective_values")
            values["objective_values"] = {
                name: _optional_float(v, f"objective value {name!r}")
                for name, v in objectives.items()
            }
        if values.get("epochs_done", 0) is None:
            del values["epochs_done"]
        reason = _optional_text(stop_reason, "stop_reason")
        with self._session(write=True) as session:
            row = self._lock_trial(session, trial_id)
            if row.status != TrialStatus.RUNNING:
                raise InvalidStateError(
                    f"trial {row.number} of study {row.study_id} is already {row.status}"
                )
            row.status = end.value
            row.stop_reason = reason
            row.finished_at = self._now()
            for key, value in values.items():
                setattr(row, key, value)
            session.flush()
            return _trial_record(row)

    def fail_running_trials(self, study_id: int, reason: str) -> int:
        """Mark every running trial of the study failed with ``reason`` (after taking over a
        study from a dead worker); returns how many."""
        text = _required_text(reason, "reason", 10_000)
        with self._session(write=True) as session:
            self._lock_study(session, study_id)
            return self._fail_trials(session, study_id, text, self._now())

    def _require_study(self, session: Session, study_id: int) -> None:
        found = session.execute(
            select(StudyRow.id).where(StudyRow.id == study_id)
        ).scalar_one_or_none()
        if found is None:
            raise NotFoundError(f"study {study_id} does not exist")

    def get_trial(self, study_id: int, number: int) -> TrialRecord:
        with self._session(write=False) as session:
            row = self._find_trial(session, study_id, number)
            if row is None:
                self._require_study(session, study_id)
                raise NotFoundError(f"study {study_id} has no trial number {number}")
            return _trial_record(row)

    def get_trial_by_id(self, trial_id: int) -> TrialRecord:
        with self._session(write=False) as session:
            row = session.get(TrialRow, trial_id)
            if row is None:
                raise NotFoundError(f"trial id {trial_id} does not exist")
            return _trial_record(row)

    def list_trials(
        self,
        study_id: int,
        *,
        status: TrialStatus | str | Iterable[TrialStatus | str] | None = None,
        baseline: bool | None = None,
        sort: str = "number",
        limit: int = 100,
        offset: int = 0,
    ) -> Page[TrialRecord]:
        """A page of the study's trials. ``sort`` is one of :data:`TRIAL_SORT_KEYS`, ``-``
        for descending; ties go by number in the same direction, and trials without a value
        come last either way (by number, in the same direction). ``baseline``:
        ``True`` only baselines, ``False`` only tuned trials."""
        limit, offset = _page_bounds(limit, offset)
        key = sort[1:] if sort.startswith("-") else sort
        if key not in TRIAL_SORT_KEYS:
            raise ValidationError(
                f"cannot sort trials by {sort!r}; use one of {', '.join(TRIAL_SORT_KEYS)} "
                "(prefix - for descending)"
            )
        statuses = _statuses(status, _trial_status)
        if baseline is not None:
            baseline = bool(baseline)
        with self._session(write=False) as session:
            conn = session.connection()
            total, items = _trial_page(
                conn, study_id, statuses, baseline, key, sort.startswith("-"), limit, offset
            )
            if total == 0:
                self._require_study(session, study_id)
        return Page(items=items, total=total, limit=limit, offset=offset)

    # -- metrics ---------------------------------------------------------------------------

    def trial_metrics(self, trial_id: int) -> list[EpochMetrics]:
        """The trial's per-epoch metrics, by epoch."""
        with self._session(write=False) as session:
            rows = (
                session.connection()
                .execute(
                    select(*_METRIC_COLUMNS)
                    .where(TrialMetricRow.trial_id == trial_id)
                    .order_by(TrialMetricRow.epoch)
                )
                .all()
            )
            if not rows and session.get(TrialRow, trial_id) is None:
                raise NotFoundError(f"trial id {trial_id} does not exist")
        return [_metrics_record(row) for row in rows]

    def study_curves(self, study_id: int, *, limit: int = 50, offset: int = 0) -> Page[TrialCurve]:
        """A page of the study's learning curves: trials in number order, each with its
        per-epoch metrics by epoch (none for a trial that has not reported yet); ``total``
        counts the study's trials."""
        limit, offset = _page_bounds(limit, offset)
        with self._session(write=False) as session:
            conn = session.connection()
            total = conn.execute(_COUNT_TRIALS, {"study_id": study_id}).scalar_one()
            if total == 0:
                self._require_study(session, study_id)
            trials = conn.execute(
                _CURVE_TRIALS, {"study_id": study_id, "limit": limit, "offset": offset}
            ).all()
            epochs: dict[int, list[EpochMetrics]] = {t.id: [] for t in trials}
            if trials:
                rows = conn.execute(_CURVE_METRICS, {"ids": list(epochs)}).all()
                for row in rows:
                    epochs[row[0]].append(EpochMetrics(*row))
        items = tuple(
            TrialCurve(
                trial_id=t.id,
                number=t.number,
                baseline=t.baseline,
                status=TrialStatus(t.status),
                epochs=tuple(epochs[t.id]),
            )
            for t in trials
        )
        return Page(items=items, total=int(total), limit=limit, offset=offset)

    def metric_curves(
        self, study_id: int, metric: str = "val_accuracy"
    ) -> dict[int, list[tuple[int, float | None]]]:
        """Every trial's value of ``metric`` per epoch (``val_accuracy``, ``val_loss``: their
        columns; any other task metric, e.g. ``val_psnr``: the metrics' ``extra``), by trial
        number, in one query (trials without metrics left out).

        :meth:`study_metrics` answers the same but builds a full record (every metric column
        and the ``extra`` JSON) for each of the tens of thousands of rows of a large study,
        about three times slower; the dashboard's page needs two columns."""
        column: Any
        if metric == "val_accuracy":
            column = TrialMetricRow.val_accuracy
        elif metric == "val_loss":
            column = TrialMetricRow.val_loss
        else:
            column = TrialMetricRow.extra[metric].as_float()
        query = (
            select(TrialRow.number, TrialMetricRow.epoch, column)
            .join(TrialMetricRow, TrialMetricRow.trial_id == TrialRow.id)
            .where(TrialRow.study_id == study_id)
            .order_by(TrialRow.number, TrialMetricRow.epoch)
        )
        curves: dict[int, list[tuple[int, float | None]]] = {}
        with self._session(write=False) as session:
            for number, epoch, value in session.connection().execute(query):
                curves.setdefault(number, []).append((epoch, value))
        return curves

    def accuracy_curves(self, study_id: int) -> dict[int, list[tuple[int, float | None]]]:
        """:meth:`metric_curves` of validation accuracy."""
        return self.metric_curves(study_id, "val_accuracy")

    def epoch_origins(
        self, study_id: int, metric: str = "val_accuracy"
    ) -> dict[int, list[EpochOrigin]]:
        """Per trial number, where each stored epoch came from (fork, PBT clone, the trial's
        own training) and its cooldown probe's value of ``metric``: four keys of the metrics'
        ``extra``, one query."""
        extra = TrialMetricRow.extra
        query = (
            select(
                TrialRow.number,
                TrialMetricRow.epoch,
                extra["replayed"].as_boolean(),
                extra["forked_epochs"].as_integer(),
                extra["cloned_from"].as_integer(),
                extra[f"probe_{metric}"].as_float(),
            )
            .join(TrialMetricRow, TrialMetricRow.trial_id == TrialRow.id)
            .where(TrialRow.study_id == study_id)
            .order_by(TrialRow.number, TrialMetricRow.epoch)
        )
        origins: dict[int, list[EpochOrigin]] = {}
        with self._session(write=False) as session:
            for number, epoch, replayed, forked, cloned, probe in session.connection().execute(
                query
            ):
                origins.setdefault(number, []).append(
                    EpochOrigin(epoch, bool(replayed), int(forked or 0), cloned, probe)
                )
        return origins

    def study_metrics(self, study_id: int) -> dict[int, list[EpochMetrics]]:
        """Every trial's learning curve in one query: trial number -> metrics by epoch
        (an empty list for a trial without metrics), trials in number order."""
        with self._session(write=False) as session:
            # Core execution on the session's connection: no ORM row processing for the
            # (possibly tens of thousands of) rows.
            rows = (
                session.connection()
                .execute(
                    select(TrialRow.number, *_METRIC_COLUMNS)
                    .select_from(TrialRow)
                    .outerjoin(TrialMetricRow, TrialMetricRow.trial_id == TrialRow.id)
                    .where(TrialRow.study_id == study_id)
                    .order_by(TrialRow.number, TrialMetricRow.epoch)
                )
                .all()
            )
            if not rows:
                self._require_study(session, study_id)
        curves: dict[int, list[EpochMetrics]] = {}
        curve: list[EpochMetrics] = []
        number = None
        for row in rows:
            if row[0] != number:
                number = row[0]
                curve = curves[number] = []
            if row[2] is not None:  # the epoch of an outer-joined metrics row
                curve.append(EpochMetrics(*row[1:]))
        return curves


@functools.cache
def _trial_page_statements(
    key: str, descending: bool, by_status: bool, baseline: bool | None
) -> tuple[Executable, Executable, Executable]:
    """The three statements of a trials page (the counts, the page's rows with a value, its
    rows without one), built once per shape with bound parameters ``study_id``,
    ``statuses``, ``limit`` and ``offset``: reusing the statement objects spares SQLAlchemy
    re-deriving the result columns of a freshly built statement on every call.

    Rows with a value and rows without one are paged apart, so that each part is one range
    of the ``(study_id, key, number)`` index (:data:`~tuner.store.models.TRIAL_SORT_INDEXES`),
    read in order whatever the backend's default place for NULLs: the query never sorts the
    study's rows. Each part pages trial numbers, which that index holds (without filters,
    PostgreSQL pages from the index alone), in a subquery joined back to the rows, so only
    the page's rows are read.
    """
    column = getattr(TrialRow, key)
    where: list[ColumnElement[bool]] = [TrialRow.study_id == bindparam("study_id")]
    if by_status:
        where.append(TrialRow.status.in_(bindparam("statuses", expanding=True)))
    if baseline is not None:
        where.append(TrialRow.baseline.is_not(None) if baseline else TrialRow.baseline.is_(None))
    count = select(func.count(), func.count(column)).select_from(TrialRow).where(*where)
    # Ties (and the rows without a value) go by number in the sort's direction: one scan of
    # the index, forwards or backwards. A descending key with ascending ties would make
    # PostgreSQL read and sort every row of the study.
    number = TrialRow.number.desc() if descending else TrialRow.number.asc()
    by_value = column.desc() if descending else column.asc()

    def page_rows(part: ColumnElement[bool], *order: ColumnElement[Any]) -> Executable:
        numbers = (
            select(TrialRow.number)
            .where(*where, part)
            .order_by(*order)
            .limit(bindparam("limit"))
            .offset(bindparam("offset"))
            .subquery("page")
        )
        return (
            select(*_TRIAL_COLUMNS)
            .join(numbers, TrialRow.number == numbers.c.number)
            .where(TrialRow.study_id == bindparam("study_id"))
            .order_by(*order)
        )

    return (
        count,
        page_rows(column.is_not(None), by_value, number),
        page_rows(column.is_(None), number),
    )


def _trial_page(
    conn: Connection,
    study_id: int,
    statuses: list[str] | None,
    baseline: bool | None,
    key: str,
    descending: bool,
    limit: int,
    offset: int,
) -> tuple[int, tuple[TrialRecord, ...]]:
    """How many of the study's trials match the filters, and one page of them sorted by
    ``key`` (see :func:`_trial_page_statements`)."""
    count, with_value_rows, without_value_rows = _trial_page_statements(
        key, descending, statuses is not None, baseline
    )
    params: dict[str, Any] = {"study_id": study_id}
    if statuses is not None:
        params["statuses"] = statuses
    total, with_value = conn.execute(count, params).one()
    rows: list[Any] = []
    if offset < with_value:
        page = {**params, "limit": limit, "offset": offset}
        rows.extend(conn.execute(with_value_rows, page).all())
    if len(rows) < limit and offset + len(rows) < total:
        page = {**params, "limit": limit - len(rows), "offset": max(0, offset - with_value)}
        rows.extend(conn.execute(without_value_rows, page).all())
    return int(total), tuple(_trial_record_of(row) for row in rows)


_COUNT_TRIALS = (
    select(func.count()).select_from(TrialRow).where(TrialRow.study_id == bindparam("study_id"))
)
_CURVE_TRIALS = (
    select(TrialRow.id, TrialRow.number, TrialRow.baseline, TrialRow.status)
    .where(TrialRow.study_id == bindparam("study_id"))
    .order_by(TrialRow.number)
    .limit(bindparam("limit"))
    .offset(bindparam("offset"))
)
_CURVE_METRICS = (
    select(*_METRIC_COLUMNS)
    .where(TrialMetricRow.trial_id.in_(bindparam("ids", expanding=True)))
    .order_by(TrialMetricRow.trial_id, TrialMetricRow.epoch)
)


def _missing_schema(exc: OperationalError | ProgrammingError) -> bool:
    orig = exc.orig
    # PostgreSQL undefined_table, undefined_column: a schema older than the code
    if getattr(orig, "sqlstate", None) in ("42P01", "42703"):
        return True
    text = str(orig)
    return "no such table" in text or "no such column" in text or "has no column named" in text
