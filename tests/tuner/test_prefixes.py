"""Shared prefixes: which boundaries a schedule has, when two trials train the same prefix,
and the bounded, atomic store of boundary states."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tuner.prefixes import PrefixStore, boundaries, prefix_key
from tuner.schedule import Schedule, Stage

CONFIG: dict[str, Any] = {
    "task": "digits",
    "task_options": {},
    "seed": 3,
    "workers": 2,
    "micro_batch": None,
    "probe_at": [2, 6],
    "probe_fraction": 0.2,
    "prefix_store": "/somewhere",
    "stagetune": {"number": 7},
}


def schedule(*stages: Stage, base_lr: float = 0.1) -> Schedule:
    return Schedule(stages=stages, base_lr=base_lr, base_batch_size=32)


FIRST = Stage(0, 3, 32, lr_multiplier=1.5, warmup_epochs=1.0)


def test_boundaries_are_the_ends_of_every_stage_but_the_last() -> None:
    s = schedule(FIRST, Stage(3, 5, 64), Stage(5, 9, 256, decay="cosine"))
    assert boundaries(s) == [(1, 3), (2, 5)]
    assert boundaries(Schedule.constant(32, 4, 0.1)) == []


def test_schedules_with_the_same_first_stages_share_that_prefix() -> None:
    a = schedule(FIRST, Stage(3, 5, 64), Stage(5, 9, 256))
    b = schedule(FIRST, Stage(3, 8, 128, decay="cosine"))
    assert prefix_key(a, 1, CONFIG) == prefix_key(b, 1, CONFIG)
    # Bookkeeping does not change what a prefix trains.
    other = {**CONFIG, "stagetune": {"number": 8}, "prefix_store": "/elsewhere"}
    assert prefix_key(a, 1, other) == prefix_key(a, 1, CONFIG)
    # Nor does the one-worker noise-scale measurement, which puts the run's state back.
    assert prefix_key(a, 1, {**CONFIG, "noise_batches": 16}) == prefix_key(a, 1, CONFIG)
    # A probe after the prefix's end is not part of it; one inside it is.
    assert prefix_key(a, 1, {**CONFIG, "probe_at": [2, 4]}) == prefix_key(a, 1, CONFIG)
    assert prefix_key(a, 1, {**CONFIG, "probe_at": [1, 6]}) != prefix_key(a, 1, CONFIG)


@pytest.mark.parametrize(
    "change",
    [
        lambda s, c: (
            schedule(Stage(0, 3, 32, lr_multiplier=1.4, warmup_epochs=1.0), *s.stages[1:]),
            c,
        ),
        lambda s, c: (
            schedule(Stage(0, 3, 64, lr_multiplier=1.5, warmup_epochs=1.0), *s.stages[1:]),
            c,
        ),
        lambda s, c: (schedule(*s.stages, base_lr=0.2), c),
        lambda s, c: (s, {**c, "seed": 4}),
        lambda s, c: (s, {**c, "workers": 1}),
        lambda s, c: (s, {**c, "task_options": {"data_seed": 1}}),
        lambda s, c: (s, {**c, "probe_fraction": 0.3}),
    ],
    ids=["lr", "batch", "base-lr", "seed", "workers", "task-options", "probe-length"],
)
def test_anything_that_changes_training_changes_the_prefix(change: Any) -> None:
    a = schedule(FIRST, Stage(3, 5, 64))
    b, config = change(a, CONFIG)
    assert prefix_key(b, 1, config) != prefix_key(a, 1, CONFIG)


def test_a_prefix_is_shorter_than_the_schedule() -> None:
    a = schedule(FIRST, Stage(3, 5, 64))
    with pytest.raises(ValueError, match="1 to 1 stages"):
        prefix_key(a, 2, CONFIG)


def test_store_round_trip_usage_and_clear(tmp_path: Path) -> None:
    store = PrefixStore(tmp_path / "p")
    assert store.get("ab12") is None
    assert store.usage().states == 0
    store.put("ab12", b"x" * 100)
    store.put("cd34", b"y" * 50)
    assert store.has("ab12")
    assert store.get("ab12") == b"x" * 100
    usage = store.usage()
    assert (usage.states, usage.bytes) == (2, 150)
    store.put("ab12", b"z")  # replaced whole
    assert store.get("ab12") == b"z"
    assert not [p for p in (tmp_path / "p").iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(ValueError, match="not a prefix key"):
        store.get("../etc/passwd")
    store.clear()
    assert not (tmp_path / "p").exists()
    assert store.usage().states == 0


def test_store_keeps_to_its_bound_by_evicting_the_least_recently_used(tmp_path: Path) -> None:
    store = PrefixStore(tmp_path, max_bytes=250)
    for i, key in enumerate(("aa", "bb", "cc")):
        store.put(key, bytes(100))
        stamp = time.time() - 100 + i
        os.utime(tmp_path / f"{key}.state", (stamp, stamp))
    # The third put went over the bound and evicted the oldest, "aa".
    assert store.usage().bytes == 200
    assert not store.has("aa")
    # Reading "bb" makes it recent: the next eviction takes "cc" although it was written later.
    assert store.get("bb") is not None
    store.put("dd", bytes(100))
    assert store.has("bb")
    assert store.has("dd")
    assert not store.has("cc")
    # A state larger than the bound is still kept (the trial that wrote it may fork from it).
    store.put("ee", bytes(400))
    assert store.has("ee")
    assert store.usage().states == 1
