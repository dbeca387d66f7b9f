"""The on-disk cache of generated task data: what a second process reads is exactly what the
first generated, a bad or foreign file is generated again, and the cache never costs a run."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tuner.settings import Settings, get_settings
from workers.tasks import mnist1d
from workers.tasks.disk_cache import cache_file, cached_arrays, data_cache_dir

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This test's own cache directory, through the setting a user sets."""
    where = tmp_path / "cache"
    monkeypatch.setenv("STAGETUNE_CACHE_DIR", str(where))
    monkeypatch.delenv("STAGETUNE_DATA_CACHE", raising=False)
    get_settings.cache_clear()
    yield where
    get_settings.cache_clear()


def _no_generation(num_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    raise AssertionError("generated again: the cache was not used")


def test_a_later_process_reads_exactly_what_the_first_generated(cache_dir: Path) -> None:
    x, y = mnist1d.generate_mnist1d(60, seed=7)
    files = list((cache_dir / "data").glob("mnist1d-*.npz"))
    assert len(files) == 1
    fresh_x, fresh_y = mnist1d._make(60, 7)  # the package's own generation, no cache
    assert np.array_equal(x, fresh_x)
    assert x.dtype == np.float32
    assert x.shape == (60, 40)
    assert np.array_equal(y, fresh_y)
    assert y.dtype == np.int64
    # Another process with generation made impossible still gets the same arrays.
    script = (
        "import sys, numpy as np\n"
        "from workers.tasks import mnist1d\n"
        "def fail(*a): raise SystemExit('generated again')\n"
        "mnist1d._make = fail\n"
        "x, y = mnist1d.generate_mnist1d(60, seed=7)\n"
        "np.save(sys.argv[1], x); np.save(sys.argv[2], y)\n"
    )
    out_x, out_y = cache_dir.parent / "x.npy", cache_dir.parent / "y.npy"
    done = subprocess.run(
        [sys.executable, "-c", script, str(out_x), str(out_y)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert np.array_equal(np.load(out_x), fresh_x)
    assert np.array_equal(np.load(out_y), fresh_y)


def test_other_arguments_get_their_own_file(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = mnist1d.generate_mnist1d(30, seed=1)
    b = mnist1d.generate_mnist1d(30, seed=2)
    c = mnist1d.generate_mnist1d(31, seed=1)
    assert len(list((cache_dir / "data").glob("mnist1d-*.npz"))) == 3
    assert not np.array_equal(a[0], b[0])
    monkeypatch.setattr(mnist1d, "_make", _no_generation)
    assert np.array_equal(mnist1d.generate_mnist1d(30, seed=1)[0], a[0])
    assert np.array_equal(mnist1d.generate_mnist1d(31, seed=1)[1], c[1])


def test_the_task_loads_its_splits_from_the_cache(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.tasks.base import clear_data_cache, load_tensors

    options = {"num_train_samples": 100, "num_val_samples": 100, "num_test_samples": 100}
    first = load_tensors(mnist1d.TASK, options, 3)
    clear_data_cache()  # as a new process: nothing in memory
    monkeypatch.setattr(mnist1d, "_make", _no_generation)
    again = load_tensors(mnist1d.TASK, options, 3)
    assert again is not first
    for split in ("train", "val", "test"):
        (xa, ya), (xb, yb) = first.split(split), again.split(split)
        assert xa.equal(xb), split
        assert ya.equal(yb), split
    clear_data_cache()


@pytest.mark.parametrize("damage", ["truncated", "not_a_zip", "another_key"])
def test_a_damaged_or_foreign_file_is_generated_again_and_replaced(
    cache_dir: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = {"n": 5}
    calls: list[int] = []

    def generate() -> dict[str, np.ndarray]:
        calls.append(1)
        return {"a": np.arange(5, dtype=np.int64)}

    where = cache_dir / "data"
    cached_arrays("demo", key, generate, directory=where)
    path = cache_file("demo", key, where)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    elif damage == "not_a_zip":
        path.write_text("hello", encoding="utf-8")
    else:  # a file at this name that holds the data of another key
        cached_arrays("demo", {"n": 6}, lambda: {"a": np.zeros(6)}, directory=where)
        cache_file("demo", {"n": 6}, where).replace(path)
    with caplog.at_level(logging.WARNING, logger="workers.tasks.disk_cache"):
        got = cached_arrays("demo", key, generate, directory=where)
    assert np.array_equal(got["a"], np.arange(5))
    assert len(calls) == 2
    assert "generating it again" in caplog.text
    cached_arrays("demo", key, generate, directory=where)  # the replaced file is good
    assert len(calls) == 2


def test_a_directory_that_cannot_be_written_costs_a_warning_not_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("", encoding="utf-8")  # the cache "directory" is a file
    with caplog.at_level(logging.WARNING, logger="workers.tasks.disk_cache"):
        got = cached_arrays("demo", {}, lambda: {"a": np.ones(3)}, directory=blocked / "data")
    assert np.array_equal(got["a"], np.ones(3))
    assert "cannot write" in caplog.text
    assert "STAGETUNE_CACHE_DIR" in caplog.text


def test_the_cache_can_be_turned_off(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGETUNE_DATA_CACHE", "false")
    get_settings.cache_clear()
    assert data_cache_dir() is None
    mnist1d.generate_mnist1d(20, seed=4)
    assert not cache_dir.exists()


def test_where_the_cache_lives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STAGETUNE_CACHE_DIR", raising=False)  # the test session's own
    assert Settings(cache_dir=tmp_path / "c").resolved_cache_dir == (tmp_path / "c").resolve()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert Settings().resolved_cache_dir == (tmp_path / "xdg" / "stagetune").resolve()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Settings().resolved_cache_dir == (tmp_path / "home" / ".cache" / "stagetune")
