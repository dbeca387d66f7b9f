"""Shared schedule prefixes: trial state saved at stage boundaries, for other trials to fork.

Two schedules whose first ``k`` stages are the same (and whose run-wide settings, task, seed
and training settings are the same) train exactly the same epochs up to the end of stage
``k``: the trial loop's data order, LR and placement up to that epoch depend on nothing else.
So a trial saves its whole state when it reaches a stage boundary, and a later trial whose
schedule starts with the same stages starts from that state instead of training the prefix
again (a *fork*). The forked trial re-reports the prefix's per-epoch results as they were
recorded, so everything downstream (ASHA's rungs, the store, the dashboard) sees exactly the
results of training the whole schedule in one go.

This module is the pure part (no torch): which boundaries a schedule has, the key of a prefix,
and :class:`PrefixStore`, a directory of opaque state blobs with a size bound (least recently
used blobs are evicted first). The trainable serialises the state (``workers.trainable``).
On a cluster the directory must be on storage every node sees (a shared file system) for a
trial on one node to fork from a prefix trained on another; otherwise the trial simply trains
its prefix.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tuner.schedule import Schedule
from tuner.trial_config import STOP_AFTER_KEY

__all__ = [
    "PREFIX_CONFIG_EXCLUDED",
    "PrefixStore",
    "PrefixUsage",
    "boundaries",
    "prefix_key",
]

#: Trial-config keys that do not change what a prefix trains (bookkeeping, the store itself,
#: where the stage-wise search stops a trial, the one-worker noise-scale measurement, which
#: puts the run's state back, and probes, whose epochs inside the prefix are added to the key
#: separately).
PREFIX_CONFIG_EXCLUDED: Final = frozenset(
    {
        "schedule",
        "stagetune",
        "probe_at",
        "prefix_store",
        "prefix_store_bytes",
        "noise_batches",
        STOP_AFTER_KEY,
    }
)

_SUFFIX: Final = ".state"


def boundaries(schedule: Schedule) -> list[tuple[int, int]]:
    """The stage boundaries a prefix can end at: ``(stages in the prefix, epoch)`` for the end
    of every stage but the last (the end of the last stage is the end of the run)."""
    return [(i + 1, st.end_epoch) for i, st in enumerate(schedule.stages[:-1])]


def prefix_key(schedule: Schedule, stages: int, config: Mapping[str, Any]) -> str:
    """The key of the first ``stages`` stages of ``schedule`` trained under the trial config
    ``config``: equal keys train bit-identical prefixes.

    It covers the schedule's run-wide settings (not its placement hint or provenance), the
    prefix's stages, every config key but :data:`PREFIX_CONFIG_EXCLUDED`, and the cooldown
    probes that run inside the prefix (their results are part of what a fork re-reports)."""
    if not 1 <= stages < schedule.num_stages:
        raise ValueError(f"a prefix has 1 to {schedule.num_stages - 1} stages, not {stages}")
    doc = schedule.to_dict()
    for key in ("placement", "provenance"):
        doc.pop(key, None)
    doc["stages"] = doc["stages"][:stages]
    end = schedule.stages[stages - 1].end_epoch
    probes = sorted(int(p) for p in config.get("probe_at") or () if int(p) <= end)
    context = {k: v for k, v in config.items() if k not in PREFIX_CONFIG_EXCLUDED}
    text = json.dumps(
        {"schedule": doc, "config": context, "probe_at": probes},
        sort_keys=True,
        default=str,
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class PrefixUsage:
    """What a prefix store holds: ``states`` blobs taking ``bytes`` on disk."""

    states: int
    bytes: int


class PrefixStore:
    """A directory of prefix states, ``<key>.state`` each, at most ``max_bytes`` in all.

    Writes are atomic (a temporary file renamed into place), so a reader sees a whole state or
    none, also when two trials save the same prefix at once or a process is killed mid-write.
    A read marks the state as recently used; :meth:`put` evicts the least recently used states
    until the store fits its bound again (never the one just written)."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes

    def _file(self, key: str) -> Path:
        if not key or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"not a prefix key: {key!r}")
        return self.path / f"{key}{_SUFFIX}"

    def has(self, key: str) -> bool:
        return self._file(key).is_file()

    def get(self, key: str) -> bytes | None:
        """The state saved under ``key``, or ``None`` (never saved, or evicted)."""
        file = self._file(key)
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            return None
        now = time.time()
        with contextlib.suppress(FileNotFoundError):  # evicted meanwhile: the bytes are whole
            os.utime(file, (now, now))
        return data

    def put(self, key: str, data: bytes) -> None:
        """Save ``data`` under ``key`` (replacing any earlier one), then keep to the bound."""
        self.path.mkdir(parents=True, exist_ok=True)
        target = self._file(key)
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if self.max_bytes is not None:
            self._evict(keep=target)

    def _entries(self) -> list[tuple[float, int, Path]]:
        out = []
        try:
            files = list(self.path.iterdir())
        except FileNotFoundError:
            return []
        for file in files:
            if not file.name.endswith(_SUFFIX):
                continue
            try:
                stat = file.stat()
            except FileNotFoundError:
                continue
            out.append((stat.st_mtime, stat.st_size, file))
        return out

    def _evict(self, keep: Path) -> None:
        entries = sorted(self._entries())
        total = sum(size for _, size, _ in entries)
        assert self.max_bytes is not None
        for _, size, file in entries:
            if total <= self.max_bytes:
                break
            if file == keep:
                continue
            file.unlink(missing_ok=True)
            total -= size

    def usage(self) -> PrefixUsage:
        entries = self._entries()
        return PrefixUsage(states=len(entries), bytes=sum(size for _, size, _ in entries))

    def clear(self) -> None:
        """Delete the store and everything in it."""
        shutil.rmtree(self.path, ignore_errors=True)
