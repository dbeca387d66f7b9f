"""A deleted study's files on the Ray storage path and its Optuna study are removed by a
worker (``tuner.leftovers``), on a real SQLite file and the real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import optuna
import pytest

from tuner.leftovers import FILES_WAIT, remove_leftovers, remove_study_files, study_files
from tuner.optuna_storage import open_storage
from tuner.store import StudyRecord, StudyStore, experiment_name

SPEC = {
    "task": "synthetic",
    "objective": {"kind": "accuracy", "epochs": 4},
    "space": {"stages": [1, 2], "batch_sizes": [64, 256]},
    "budget": 2,
}


@pytest.fixture
def store(db_url: str) -> Iterator[StudyStore]:
    with StudyStore(db_url, create=True) as s:
        yield s


def finished_study(store: StudyStore) -> StudyRecord:
    study = store.create_study("synthetic", SPEC, 2)
    assert store.claim_study("w1", stale_after_s=60) is not None
    store.finish_study(study.id, "completed")
    return study


def lay_out_files(storage: Path, name: str) -> dict[str, Path]:
    """What a study leaves on the storage path: Tune's experiment with a checkpoint, the seed
    runs' and reserves' experiments, the stage-boundary states, a set-aside experiment."""
    paths = {}
    for suffix in ("", ".seeds", ".reserves", ".prefixes", ".unreadable-20261130-120000"):
        d = storage / f"{name}{suffix}"
        (d / "trial_0" / "checkpoint_000001").mkdir(parents=True)
        (d / "trial_0" / "checkpoint_000001" / "state.pkl").write_bytes(b"x" * 1000)
        (d / "tuner.pkl").write_bytes(b"y" * 24)
        paths[suffix] = d
    return paths


def test_a_workers_pass_removes_a_deleted_studys_files_and_optuna_study(
    store: StudyStore, tmp_path: Path
) -> None:
    storage = tmp_path / "ray"
    gone, kept = finished_study(store), finished_study(store)
    name, other = (experiment_name(s.id, s.created_at) for s in (gone, kept))
    files = lay_out_files(storage, name)
    lay_out_files(storage, other)
    # another database's study with the same id: the same prefix, another token
    stranger = storage / f"study-{gone.id}-00000000"
    stranger.mkdir()
    url = store.url.render_as_string(hide_password=False)
    optuna_storage = open_storage(url, {})
    for study in (gone, kept):
        optuna.create_study(study_name=f"stagetune-study-{study.id}", storage=optuna_storage)

    assert study_files(storage, name) == sorted(files.values())
    store.delete_study(gone.id)
    assert all(p.exists() for p in files.values())  # the delete itself touches no file

    removal = remove_leftovers(store, storage)
    assert removal.studies == [gone.id]
    assert removal.paths_removed == 5
    assert removal.bytes_freed == 5 * 1024
    assert removal.optuna_studies_removed == 1
    assert removal.failed == {}
    assert not any(p.exists() for p in files.values())
    assert len(study_files(storage, other)) == 5
    assert stranger.is_dir()
    names = {s.study_name for s in optuna.get_all_study_summaries(optuna_storage)}
    assert names == {f"stagetune-study-{kept.id}"}
    assert store.study_leftovers() == []
    assert remove_leftovers(store, storage).studies == []  # nothing left to do
    optuna_storage.engine.dispose()


def test_a_removal_that_leaves_files_behind_is_kept_and_tried_again(
    store: StudyStore, tmp_path: Path
) -> None:
    study = finished_study(store)
    storage = tmp_path / "ray"
    storage.parent.mkdir(exist_ok=True)
    storage.write_text("not a directory")  # a misconfigured storage path
    store.delete_study(study.id)

    removal = remove_leftovers(store, storage)
    assert removal.studies == []
    assert list(removal.failed) == [study.id]
    assert "NotADirectoryError" in removal.failed[study.id]
    (record,) = store.study_leftovers()
    assert record.attempts == 1
    assert record.error == removal.failed[study.id]

    storage.unlink()  # fixed: the study's files are on the path again
    files = lay_out_files(storage, record.experiment)
    assert remove_leftovers(store, storage).studies == [study.id]
    assert not any(p.exists() for p in files.values())
    assert store.study_leftovers() == []


def test_a_study_with_no_files_and_no_optuna_tables_is_forgotten(
    store: StudyStore, tmp_path: Path
) -> None:
    study = store.create_study("synthetic", SPEC, 2)  # queued, never ran
    store.delete_study(study.id)
    removal = remove_leftovers(store, tmp_path / "never-created")
    assert removal.studies == [study.id]
    assert removal.paths_removed == 0
    assert store.study_leftovers() == []


def test_a_study_that_ran_waits_for_the_worker_whose_storage_path_holds_its_files(
    store: StudyStore, tmp_path: Path
) -> None:
    """A worker whose storage path is not the one the study ran on finds none of its files:
    it removes the Optuna study but keeps the record, with why, so the worker holding the
    files removes them; an hour after the delete it forgets it."""
    study = finished_study(store)
    ran_on, elsewhere = tmp_path / "ray-a", tmp_path / "ray-b"
    url = store.url.render_as_string(hide_password=False)
    optuna_storage = open_storage(url, {})
    optuna.create_study(study_name=f"stagetune-study-{study.id}", storage=optuna_storage)
    store.delete_study(study.id)
    (record,) = store.study_leftovers()
    assert record.started_at is not None
    files = lay_out_files(ran_on, record.experiment)

    removal = remove_leftovers(store, elsewhere)
    assert removal.studies == []
    assert removal.failed == {}
    assert removal.optuna_studies_removed == 1
    reason = removal.waiting[study.id]
    assert f"no files of {record.experiment} under {elsewhere}" in reason
    (kept,) = store.study_leftovers()
    assert (kept.attempts, kept.error) == (1, reason)
    assert optuna.get_all_study_summaries(optuna_storage) == []
    optuna_storage.engine.dispose()

    removal = remove_leftovers(store, ran_on)  # the worker that ran it
    assert removal.studies == [study.id]
    assert removal.paths_removed == 5
    assert not any(p.exists() for p in files.values())
    assert store.study_leftovers() == []

    other = finished_study(store)
    store.delete_study(other.id)
    (record,) = store.study_leftovers()
    assert remove_leftovers(store, elsewhere, now=record.requested_at + FILES_WAIT / 2).waiting
    late = record.requested_at + FILES_WAIT + timedelta(seconds=1)
    assert remove_leftovers(store, elsewhere, now=late).studies == [other.id]
    assert store.study_leftovers() == []


def test_only_a_study_experiment_name_is_ever_a_path(tmp_path: Path) -> None:
    (tmp_path / "keep").mkdir()
    for bad in ("", "..", "../keep", "study-1", "study-1-abc", "study-1-0123456g", "keep"):
        with pytest.raises(ValueError, match="not a study's experiment name"):
            remove_study_files(tmp_path, bad)
    assert (tmp_path / "keep").is_dir()


def test_a_symbolic_link_is_removed_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    storage = tmp_path / "ray"
    storage.mkdir()
    name = "study-3-0123abcd"
    (storage / f"{name}.prefixes").symlink_to(outside)
    assert remove_study_files(storage, name)[0] == 1
    assert not (storage / f"{name}.prefixes").exists()
    assert (outside / "precious").read_text() == "keep me"
