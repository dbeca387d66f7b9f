"""Removing what deleted studies left outside their rows.

A study's rows (trials, metrics) go with it in :meth:`StudyStore.delete_study`; what it left
elsewhere cannot go in the same transaction, so the delete records it
(:class:`~tuner.store.records.StudyLeftovers`) and a worker removes it here
(:func:`remove_leftovers`; the dispatcher does so whenever it looks for work):

* its files on the Ray storage path: the Tune experiment directory ``study-<id>-<token>``
  and everything named after it (``.seeds``, ``.reserves``, ``.prefixes``, and experiments a
  restore set aside as ``.unreadable-<time>``), Tune's checkpoints included;
* its Optuna study in the same database (trials, parameters, attributes).

A removal that leaves something behind (a file system error, the database unreachable) keeps
its record, with the reason and a count of attempts, and is tried again at the next look.
Every worker of a deployment should share the storage path (take-overs need it too), so
whichever worker looks first removes the files. A worker that finds no files of a study that
ran (one whose path is not the one the study ran on) keeps its record for
:data:`FILES_WAIT` after the delete, so that the worker holding them removes them; then it
forgets it (what is left shows as unclaimed in :func:`storage_usage`). A study that never ran
has no files and is forgotten at once.

:func:`storage_usage` says what every experiment on the storage path takes and whose it is
(a study of the database, a deleted study's waiting for a worker, or unclaimed: another
database's on the same path, a study deleted before deletes removed files, an earlier
version's name), and :func:`remove_unclaimed` frees the unclaimed ones (``stagetune
storage``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from tuner.store.engine import display_url
from tuner.store.records import StudyLeftovers, experiment_name
from tuner.store.storage import StudyStore

__all__ = [
    "FILES_WAIT",
    "LeftoverRemoval",
    "StorageEntry",
    "disk_bytes",
    "remove_leftovers",
    "remove_optuna_studies",
    "remove_study_files",
    "remove_unclaimed",
    "storage_usage",
    "study_files",
]

log = logging.getLogger(__name__)

#: What :func:`tuner.store.records.experiment_name` writes; anything else is never a path.
_EXPERIMENT = re.compile(r"study-[0-9]+-[0-9a-f]{8}")
#: An entry of the storage path that belongs to a study's experiment: the experiment (or its
#: name before the token, ``study-<id>``, which earlier versions wrote) and a neighbour suffix.
_ENTRY = re.compile(r"(study-([0-9]+)(?:-[0-9a-f]{8})?)(?:\..+)?")

#: How long after a delete a worker that finds none of a study's files on its storage path
#: keeps the record, when the study ran, for a worker whose path holds them.
FILES_WAIT: Final = timedelta(hours=1)


@dataclass
class LeftoverRemoval:
    """What one :func:`remove_leftovers` pass did."""

    studies: list[int] = field(default_factory=list)
    """Deleted studies whose leftovers are now gone."""
    bytes_freed: int = 0
    paths_removed: int = 0
    optuna_studies_removed: int = 0
    failed: dict[int, str] = field(default_factory=dict)
    """Deleted studies whose removal left something behind, with why (tried again later)."""
    waiting: dict[int, str] = field(default_factory=dict)
    """Deleted studies that ran but have no files on this storage path, with why: kept until
    :data:`FILES_WAIT` after their delete for a worker whose path holds them."""


def study_files(storage_path: str | os.PathLike[str], experiment: str) -> list[Path]:
    """The entries of ``storage_path`` that belong to the experiment ``experiment``: its
    directory and every neighbour named ``<experiment>.<something>``, sorted."""
    if not _EXPERIMENT.fullmatch(experiment):
        raise ValueError(f"{experiment!r} is not a study's experiment name (study-<id>-<token>)")
    root = Path(storage_path)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(
        root / name for name in names if name == experiment or name.startswith(f"{experiment}.")
    )


def disk_bytes(path: Path) -> int:
    """Bytes under ``path`` (symbolic links counted as links, never followed; files that go
    while it counts are skipped)."""
    try:
        if not path.is_dir() or path.is_symlink():
            return path.lstat().st_size
    except FileNotFoundError:
        return 0
    total = 0
    for parent, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except FileNotFoundError:
                continue
    return total


def remove_study_files(storage_path: str | os.PathLike[str], experiment: str) -> tuple[int, int]:
    """Delete the experiment's entries on the storage path (:func:`study_files`); returns
    ``(paths removed, bytes freed)``. ``OSError`` naming what is left when one could not be
    removed (the others are removed all the same)."""
    return _remove_paths(study_files(storage_path, experiment))


def _remove_paths(paths: Sequence[Path]) -> tuple[int, int]:
    """Delete ``paths`` (directories with what they hold; a symbolic link is removed, never
    followed); ``(paths removed, bytes freed)``, or ``OSError`` naming what is left when one
    could not be removed (the others are removed all the same)."""
    removed, freed = 0, 0
    problems: list[str] = []
    for path in paths:
        size = disk_bytes(path)
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
            continue
        removed += 1
        freed += size
    if problems:
        raise OSError(f"could not remove {'; '.join(problems)}")
    return removed, freed


def remove_optuna_studies(url: str, names: tuple[str, ...] | list[str]) -> int:
    """Delete the Optuna studies called ``names`` from the database at ``url`` (names that
    are not there are skipped); returns how many were deleted."""
    if not names:
        return 0
    from tuner.optuna_storage import open_existing  # imports Optuna: only when needed

    storage = open_existing(url)
    if storage is None:  # no Optuna tables: the study never sampled a schedule
        return 0
    deleted = 0
    try:
        for name in names:
            try:
                optuna_id = storage.get_study_id_from_name(name)
            except KeyError:
                continue
            storage.delete_study(optuna_id)
            deleted += 1
    finally:
        storage.engine.dispose()
    return deleted


def remove_leftovers(
    store: StudyStore,
    storage_path: str | os.PathLike[str],
    *,
    limit: int = 100,
    study_id: int | None = None,
    skip: Collection[int] = (),
    now: datetime | None = None,
) -> LeftoverRemoval:
    """Remove what up to ``limit`` deleted studies (or the deleted study ``study_id``) left
    behind, oldest first (but those of the studies in ``skip``: a caller backing off after a
    failure): their files on ``storage_path`` and their Optuna studies. Each
    removed completely is forgotten; any other keeps its record with the reason
    (:meth:`StudyStore.leftovers_not_removed`), and so does one that ran but has no files
    here, until :data:`FILES_WAIT` after its delete (``now``: the current time, UTC).
    Database errors reading the records propagate (the caller retries later)."""
    done = LeftoverRemoval()
    now = now or datetime.now(UTC)
    for item in store.study_leftovers(limit, study_id=study_id):
        if item.study_id in skip:
            continue
        try:
            paths, freed, optuna = _remove(store, storage_path, item)
        except Exception as exc:  # kept for the next look, with the reason
            reason = f"{type(exc).__name__}: {exc}"
            log.warning(
                "could not remove all that deleted study %s left behind (attempt %d): %s",
                item.study_id,
                item.attempts + 1,
                reason,
            )
            done.failed[item.study_id] = reason
            try:
                store.leftovers_not_removed(item.id, reason)
            except Exception:  # the record stays as it was: tried again all the same
                log.exception("could not record the failed removal of study %s", item.study_id)
            continue
        if paths == 0 and item.started_at is not None and now < item.requested_at + FILES_WAIT:
            until = (item.requested_at + FILES_WAIT).strftime("%Y-%m-%d %H:%M UTC")
            reason = (
                f"no files of {item.experiment} under {storage_path}; kept until {until} for "
                "a worker whose storage path holds them (the study ran)"
            )
            log.info("deleted study %s: %s", item.study_id, reason)
            done.waiting[item.study_id] = reason
            done.optuna_studies_removed += optuna
            try:
                store.leftovers_not_removed(item.id, reason)
            except Exception:
                log.exception("could not record the wait for study %s's files", item.study_id)
            continue
        store.leftovers_removed(item.id)
        done.studies.append(item.study_id)
        done.paths_removed += paths
        done.bytes_freed += freed
        done.optuna_studies_removed += optuna
        log.info(
            "removed what deleted study %s left behind: %d paths (%d bytes) under %s",
            item.study_id,
            paths,
            freed,
            storage_path,
        )
    return done


def _remove(
    store: StudyStore, storage_path: str | os.PathLike[str], item: StudyLeftovers
) -> tuple[int, int, int]:
    paths, freed = remove_study_files(storage_path, item.experiment)
    url = store.url.render_as_string(hide_password=False)
    try:
        optuna = remove_optuna_studies(url, item.optuna_studies)
    except Exception as exc:
        raise RuntimeError(
            f"the Optuna study {', '.join(item.optuna_studies)} in {display_url(store.url)}: {exc}"
        ) from exc
    return paths, freed, optuna


@dataclass(frozen=True)
class StorageEntry:
    """One experiment's files on the storage path (the directory and its neighbours)."""

    experiment: str
    study_id: int
    paths: tuple[Path, ...]
    bytes: int
    owner: str
    """``"study"``: a study of this database; ``"deleted"``: a deleted study's, waiting for a
    worker; ``"unclaimed"``: no study of this database has this name (another database's on
    the same path, one deleted before deletes removed files, or an earlier version's name)."""
    status: str | None = None
    """The study's status when ``owner`` is ``"study"``."""


def storage_usage(store: StudyStore, storage_path: str | os.PathLike[str]) -> list[StorageEntry]:
    """Every experiment on ``storage_path`` with its size and whose it is, by study id."""
    root = Path(storage_path)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    groups: dict[str, list[Path]] = {}
    for name in names:
        match = _ENTRY.fullmatch(name)
        if match:
            groups.setdefault(match.group(1), []).append(root / name)
    studies: dict[str, str] = {}
    offset = 0
    while True:
        page = store.list_studies(limit=1000, offset=offset)
        for study in page.items:
            studies[experiment_name(study.id, study.created_at)] = study.status.value
        offset += len(page.items)
        if not page.has_more:
            break
    deleted = {item.experiment for item in store.study_leftovers(1000)}
    out = []
    for experiment, paths in groups.items():
        match = _ENTRY.fullmatch(experiment)
        assert match is not None
        if experiment in studies:
            owner, status = "study", studies[experiment]
        else:
            owner, status = ("deleted" if experiment in deleted else "unclaimed"), None
        out.append(
            StorageEntry(
                experiment=experiment,
                study_id=int(match.group(2)),
                paths=tuple(sorted(paths)),
                bytes=sum(disk_bytes(p) for p in paths),
                owner=owner,
                status=status,
            )
        )
    return sorted(out, key=lambda e: (e.study_id, e.experiment))


def remove_unclaimed(entries: list[StorageEntry]) -> tuple[int, int]:
    """Delete the ``"unclaimed"`` entries' paths; returns ``(paths removed, bytes freed)``.
    ``OSError`` naming what is left when one could not be removed."""
    return _remove_paths([p for e in entries if e.owner == "unclaimed" for p in e.paths])
