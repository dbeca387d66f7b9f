"""The dispatcher's mechanics against real databases (SQLite and PostgreSQL), with a stand-in
runner (no Ray): claiming in order, ``once`` / ``max_studies``, heartbeats from the background
thread, failures, take-over of a dead worker's study, and shutdown."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from tuner.errors import ClusterUnavailableError
from tuner.schedule import Schedule, Stage
from tuner.settings import Settings
from tuner.store import StudyStatus, StudyStore, TrialStatus, experiment_name
from tuner.store.migrate import upgrade
from workers.dispatcher import Dispatcher, Heartbeat

SPEC: dict[str, Any] = {
    "task": "digits",
    "baselines": False,
    "budget": {"trials": 1, "seed_runs": 0},
}
SCHEDULE = Schedule(stages=(Stage(0, 1, 32),), base_lr=0.1, base_batch_size=32).to_dict()


def settings(**kw: Any) -> Settings:
    values: dict[str, Any] = {"heartbeat_s": 0.05, "stale_after_s": 30.0, "poll_s": 0.05}
    values.update(kw)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest.fixture
def store(db_url: str) -> Iterator[StudyStore]:
    upgrade(db_url)
    with StudyStore(db_url) as s:
        yield s


def queue(store: StudyStore, n: int) -> list[int]:
    return [store.create_study("digits", SPEC, 1, name=f"s{i}").id for i in range(n)]


class FakeRunner:
    """Runs a study the way the real runner ends one: a trial, then the study completed."""

    def __init__(self, work_s: float = 0.0, fail: BaseException | None = None) -> None:
        self.work_s = work_s
        self.fail = fail
        self.calls: list[tuple[int, str]] = []
        self.heartbeats: list[tuple[Any, Any]] = []

    def __call__(self, store: StudyStore, study_id: int, worker_id: str) -> None:
        self.calls.append((study_id, worker_id))
        study = store.get_study(study_id)
        assert study.status is StudyStatus.RUNNING
        assert study.worker_id == worker_id
        trial = store.create_trial(study_id, 0, SCHEDULE, {})
        time.sleep(self.work_s)
        after = store.get_study(study_id)
        self.heartbeats.append((study.heartbeat_at, after.heartbeat_at))
        if self.fail is not None:
            raise self.fail
        store.finish_trial(trial.id, TrialStatus.COMPLETED, final={"val_accuracy": 0.5})
        store.finish_study(study_id, StudyStatus.COMPLETED, worker_id=worker_id)


def test_runs_every_queued_study_once_oldest_first(store: StudyStore) -> None:
    ids = queue(store, 3)
    runner = FakeRunner()
    dispatcher = Dispatcher(store, settings(), runner=runner, worker_id="w1", once=True)
    stats = dispatcher.run()
    assert stats.studies == ids
    assert [c[0] for c in runner.calls] == ids
    for study_id in ids:
        study = store.get_study(study_id)
        assert study.status is StudyStatus.COMPLETED
        assert (study.attempts, study.worker_id) == (1, "w1")
        assert store.list_trials(study_id).total == 1
    assert dispatcher.run().studies == ids  # nothing left: a second pass claims nothing


def test_max_studies_stops_after_that_many(store: StudyStore) -> None:
    ids = queue(store, 3)
    stats = Dispatcher(store, settings(), runner=FakeRunner(), max_studies=2).run()
    assert stats.studies == ids[:2]
    assert store.get_study(ids[2]).status is StudyStatus.QUEUED


def test_heartbeats_from_a_background_thread_while_the_runner_works(store: StudyStore) -> None:
    (study_id,) = queue(store, 1)
    runner = FakeRunner(work_s=1.0)
    Dispatcher(store, settings(heartbeat_s=0.1), runner=runner, once=True).run()
    before, after = runner.heartbeats[0]
    assert after - before >= timedelta(seconds=0.3)
    assert store.get_study(study_id).status is StudyStatus.COMPLETED


def test_runner_error_fails_the_study_with_the_message_and_goes_on(store: StudyStore) -> None:
    first, second = queue(store, 2)

    class FailFirst(FakeRunner):
        def __call__(self, store: StudyStore, study_id: int, worker_id: str) -> None:
            self.fail = RuntimeError("CUDA out of memory") if study_id == first else None
            super().__call__(store, study_id, worker_id)

    stats = Dispatcher(store, settings(), runner=FailFirst(), once=True).run()
    assert stats.failed == [first]
    failed = store.get_study(first)
    assert failed.status is StudyStatus.FAILED
    assert failed.error == "RuntimeError: CUDA out of memory"
    assert store.get_trial(first, 0).status is TrialStatus.FAILED  # closed with the study
    assert store.get_study(second).status is StudyStatus.COMPLETED


def test_runner_returning_without_finishing_fails_the_study(store: StudyStore) -> None:
    (study_id,) = queue(store, 1)
    Dispatcher(store, settings(), runner=lambda s, i, w: None, once=True).run()
    study = store.get_study(study_id)
    assert study.status is StudyStatus.FAILED
    assert study.error is not None
    assert "without finishing" in study.error


def test_takes_over_the_study_of_a_dead_worker(store: StudyStore) -> None:
    (study_id,) = queue(store, 1)
    assert store.claim_study("dead-worker", 30.0) is not None  # ... which then stops beating
    runner = FakeRunner()
    assert Dispatcher(store, settings(), runner=runner, once=True).run().studies == []

    time.sleep(0.3)
    dispatcher = Dispatcher(store, settings(stale_after_s=0.2), runner=runner, worker_id="w2")
    assert dispatcher.run_one() is not None
    study = store.get_study(study_id)
    assert study.status is StudyStatus.COMPLETED
    assert (study.worker_id, study.attempts) == ("w2", 2)
    assert runner.calls == [(study_id, "w2")]


def test_stop_ends_an_idle_loop(store: StudyStore) -> None:
    dispatcher = Dispatcher(store, settings(poll_s=0.05), runner=FakeRunner())
    thread = threading.Thread(target=dispatcher.run)
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive()  # without `once` an idle dispatcher keeps polling
    queue(store, 1)
    deadline = time.monotonic() + 10
    while not dispatcher.stats.studies and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(dispatcher.stats.studies) == 1  # picked up a study queued while it polled
    dispatcher.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_interrupted_runner_gives_the_study_back(store: StudyStore) -> None:
    first, second = queue(store, 2)

    def interrupted(store: StudyStore, study_id: int, worker_id: str) -> None:
        store.create_trial(study_id, 0, SCHEDULE, {})
        raise KeyboardInterrupt

    stats = Dispatcher(store, settings(), runner=interrupted, once=True).run()
    assert (stats.studies, stats.released, stats.interrupted) == ([first], [first], True)
    study = store.get_study(first)
    assert study.status is StudyStatus.QUEUED
    assert study.worker_id is None
    assert store.get_study(second).attempts == 0  # nothing new claimed after the interrupt


def test_heartbeat_thread_stops_when_the_study_is_taken_over(store: StudyStore) -> None:
    (study_id,) = queue(store, 1)
    assert store.claim_study("w1", 30.0) is not None
    with Heartbeat(store, study_id, "w1", 0.3) as beat:
        deadline = time.monotonic() + 10
        while beat.beats < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # w2 takes the study over as soon as w1's heartbeat is 0.1 s old.
        while store.claim_study("w2", 0.1) is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        while beat.lost is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert "now belongs to worker 'w2'" in beat.lost
    study = store.get_study(study_id)
    assert (study.worker_id, study.attempts) == ("w2", 2)


def test_max_studies_must_be_positive(store: StudyStore) -> None:
    with pytest.raises(ValueError, match="max_studies"):
        Dispatcher(store, settings(), runner=FakeRunner(), max_studies=0)


def test_database_outage_while_idle_is_retried(store: StudyStore) -> None:
    (study_id,) = queue(store, 1)

    class Flaky:
        """The store, whose first two claims fail as if the database were down."""

        failures = 2

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def claim_study(self, worker_id: str, stale_after_s: float) -> Any:
            if self.failures:
                self.failures -= 1
                raise OperationalError("SELECT ...", {}, Exception("connection refused"))
            return store.claim_study(worker_id, stale_after_s)

    flaky = Flaky()
    dispatcher = Dispatcher(flaky, settings(), runner=FakeRunner(), once=True)  # type: ignore[arg-type]
    assert dispatcher.run().studies == [study_id]
    assert flaky.failures == 0
    assert store.get_study(study_id).status is StudyStatus.COMPLETED


class RayDownFirst(FakeRunner):
    """The runner while Ray cannot be reached: its first ``down`` studies end the way
    ``workers.runner.run_study`` ends one then (no trial; the error), then Ray is back."""

    def __init__(self, down: int) -> None:
        super().__init__()
        self.down = down

    def __call__(self, store: StudyStore, study_id: int, worker_id: str) -> None:
        if self.down:
            self.down -= 1
            self.calls.append((study_id, worker_id))
            raise ClusterUnavailableError("could not connect to the Ray cluster at RAY_ADDRESS=h:1")
        super().__call__(store, study_id, worker_id)


def test_a_study_that_cannot_reach_ray_is_given_back_and_run_once_ray_is_back(
    store: StudyStore,
) -> None:
    (study_id,) = queue(store, 1)
    runner = RayDownFirst(down=2)
    dispatcher = Dispatcher(store, settings(poll_s=0.05), runner=runner, worker_id="w1")
    thread = threading.Thread(target=dispatcher.run)
    thread.start()
    deadline = time.monotonic() + 20
    while store.get_study(study_id).status is not StudyStatus.COMPLETED:
        assert time.monotonic() < deadline, store.get_study(study_id)
        time.sleep(0.02)
    dispatcher.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    stats = dispatcher.stats
    # claimed three times: given back twice (not failed), then run
    assert [c[0] for c in runner.calls] == [study_id] * 3
    assert (stats.released, stats.failed, stats.unavailable) == ([study_id] * 2, [], None)
    study = store.get_study(study_id)
    assert (study.attempts, study.error) == (3, None)


def test_once_gives_back_a_study_that_cannot_reach_ray_and_stops(store: StudyStore) -> None:
    first, second = queue(store, 2)
    stats = Dispatcher(store, settings(), runner=RayDownFirst(down=1), once=True).run()
    assert (stats.studies, stats.released, stats.failed) == ([first], [first], [])
    assert stats.unavailable is not None
    assert "RAY_ADDRESS=h:1" in stats.unavailable
    study = store.get_study(first)
    assert (study.status, study.worker_id) == (StudyStatus.QUEUED, None)
    # not failed; why it waits is on the study until its next claim
    assert study.error == "not started: could not connect to the Ray cluster at RAY_ADDRESS=h:1"
    assert store.get_study(second).attempts == 0  # nothing claimed after it


def test_the_dispatcher_removes_the_files_of_deleted_studies_when_it_looks_for_work(
    store: StudyStore, tmp_path: Path
) -> None:
    deleted, kept = (store.create_study("digits", SPEC, 1) for _ in range(2))
    config = settings(data_dir=tmp_path)
    storage = config.resolved_ray_storage_path
    names = {s.id: experiment_name(s.id, s.created_at) for s in (deleted, kept)}
    dirs = {
        sid: [storage / f"{name}{suffix}" for suffix in ("", ".seeds", ".prefixes")]
        for sid, name in names.items()
    }
    for d in (*dirs[deleted.id], *dirs[kept.id]):
        (d / "checkpoint_000000").mkdir(parents=True)
        (d / "checkpoint_000000" / "state.pkl").write_bytes(b"x" * 100)
    store.delete_study(deleted.id)

    stats = Dispatcher(store, config, runner=FakeRunner(), once=True).run()
    assert stats.leftovers_removed == [deleted.id]
    assert not any(d.exists() for d in dirs[deleted.id])
    assert all(d.is_dir() for d in dirs[kept.id])
    assert stats.studies == [kept.id]  # and the queue ran as before
    assert store.study_leftovers() == []


def test_a_removal_that_fails_does_not_hold_up_the_queue(store: StudyStore, tmp_path: Path) -> None:
    config = settings(data_dir=tmp_path)
    config.resolved_ray_storage_path.write_text("a file where the storage path should be")
    gone = store.create_study("digits", SPEC, 1)
    store.delete_study(gone.id)
    waiting = queue(store, 1)
    stats = Dispatcher(store, config, runner=FakeRunner(), once=True).run()
    assert stats.studies == waiting
    assert stats.leftovers_removed == []
    (record,) = store.study_leftovers()  # kept, with the reason, for the next look
    assert record.study_id == gone.id
    assert record.attempts >= 1
    assert "NotADirectoryError" in (record.error or "")


@pytest.mark.parametrize("behind", [1, 2], ids=["no-started-at-column", "no-leftovers-table"])
def test_a_schema_older_than_the_leftovers_code_still_runs_studies(
    db_url: str, caplog: pytest.LogCaptureFixture, behind: int
) -> None:
    """A worker upgraded before the database (the migrate step not run yet) runs studies as
    before and says once why it removes no files: a missing column is an old schema as much
    as a missing table."""
    from tuner.store.migrate import downgrade, revisions

    upgrade(db_url)
    downgrade(db_url, revisions()[-1 - behind])
    with StudyStore(db_url) as store:
        waiting = queue(store, 2)
        with caplog.at_level("WARNING", logger="workers.dispatcher"):
            stats = Dispatcher(store, settings(), runner=FakeRunner(), once=True).run()
    assert stats.studies == waiting
    warned = [r for r in caplog.records if "not removing deleted studies' files" in r.message]
    assert len(warned) == 1


def test_a_failing_removal_is_tried_again_less_and_less_often(
    store: StudyStore, tmp_path: Path
) -> None:
    """An idle dispatcher looks for work every poll_s; a removal that keeps failing waits
    twice as long after each failure (up to 10 minutes) instead of failing, and logging,
    at every look."""
    config = settings(data_dir=tmp_path, poll_s=0.05)
    config.resolved_ray_storage_path.write_text("a file where the storage path should be")
    gone = store.create_study("digits", SPEC, 1)
    store.delete_study(gone.id)
    dispatcher = Dispatcher(store, config, runner=FakeRunner())
    thread = threading.Thread(target=dispatcher.run)
    thread.start()
    time.sleep(1.5)  # about 30 looks for work
    dispatcher.stop()
    thread.join(timeout=5)
    (record,) = store.study_leftovers()
    # failures at about 0, 0.1, 0.3, 0.7 and 1.5 s: 4-5 attempts, not 30
    assert 2 <= record.attempts <= 6, record.attempts


def test_a_study_whose_ray_cluster_stops_answering_is_given_back(store: StudyStore) -> None:
    first, second = queue(store, 2)
    cluster = socket.create_server(("127.0.0.1", 0))  # a GCS port that accepts connections
    address = f"127.0.0.1:{cluster.getsockname()[1]}"
    told: list[str] = []

    def runner(store: StudyStore, study_id: int, worker_id: str) -> None:
        store.create_trial(study_id, 0, SCHEDULE, {})
        time.sleep(1.0)  # over ray_lost_s, while the cluster answers: nothing happens
        assert store.get_study(study_id).status is StudyStatus.RUNNING
        cluster.close()  # the cluster's head is lost
        deadline = time.monotonic() + 10
        while store.get_study(study_id).status is StudyStatus.RUNNING:  # Tune waits on it
            assert time.monotonic() < deadline, "the study was not given back"
            time.sleep(0.05)

    dispatcher = Dispatcher(
        store,
        settings(ray_lost_s=0.3),
        runner=runner,
        on_ray_lost=told.append,
        ray_address=lambda: address,
    )
    stats = dispatcher.run()
    assert len(told) == 1
    assert told[0].startswith(f"the Ray cluster at {address} has not answered for")
    assert (stats.studies, stats.released, stats.ray_lost) == ([first], [first], told[0])
    study = store.get_study(first)
    assert (study.status, study.worker_id) == (StudyStatus.QUEUED, None)
    assert study.error == f"given back: {told[0]}"
    (trial,) = store.list_trials(first).items
    assert trial.status is TrialStatus.FAILED  # a later claim trains it again
    assert store.get_study(second).attempts == 0  # the dispatcher claims nothing more


def test_the_ray_watch_is_off_with_ray_lost_s_0(store: StudyStore) -> None:
    (study_id,) = queue(store, 1)
    told: list[str] = []

    def runner(store: StudyStore, study_id: int, worker_id: str) -> None:
        time.sleep(0.5)
        store.finish_study(study_id, StudyStatus.COMPLETED, worker_id=worker_id)

    stats = Dispatcher(
        store,
        settings(ray_lost_s=0),
        runner=runner,
        once=True,
        on_ray_lost=told.append,
        ray_address=lambda: "127.0.0.1:1",  # nothing listens there
    ).run()
    assert (told, stats.ray_lost, stats.studies) == ([], None, [study_id])
    assert store.get_study(study_id).status is StudyStatus.COMPLETED
