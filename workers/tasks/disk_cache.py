"""The on-disk cache of generated task data, shared by every process of a machine.

A built-in task that *generates* its data (``mnist1d``: about 0.6 ms a sample in its own
Python code, 6-15 s for the default 21,000 samples) would pay that in every process that loads
it: the study's driver and each worker of every gang. The in-process cache
(``workers.tasks.base``) cannot help across processes, so :func:`cached_arrays` keeps the
generated arrays in an ``.npz`` file under the cache directory and every later process reads
them back in milliseconds.

* The directory is the setting ``STAGETUNE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/stagetune``,
  else ``~/.cache/stagetune``); ``STAGETUNE_DATA_CACHE=false`` turns the cache off.
* A file is named by a hash of its key (the generator, its version, its arguments) and
  carries the key itself, checked on every read: a file for other arguments, an older format,
  a truncated or corrupt file is regenerated and replaced, never used.
* Writes go to a temporary file renamed into place, so processes that generate the same data
  at once never read a half-written file.
* The cache is an optimisation only: a directory that cannot be written costs a warning and
  the data is generated in memory as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

__all__ = ["CACHE_FORMAT", "cache_file", "cached_arrays", "data_cache_dir"]

log = logging.getLogger(__name__)

#: Bumped when the file layout changes: files of another format are regenerated.
CACHE_FORMAT: Final = 1
_KEY_ENTRY: Final = "__key__"

Arrays = dict[str, np.ndarray[Any, Any]]


def data_cache_dir() -> Path | None:
    """Where generated data is cached (``<cache_dir>/data``), or None when the cache is off."""
    from tuner.settings import get_settings

    settings = get_settings()
    if not settings.data_cache:
        return None
    return settings.resolved_cache_dir / "data"


def _key_text(kind: str, key: Mapping[str, Any]) -> str:
    return json.dumps({"kind": kind, "format": CACHE_FORMAT, **key}, sort_keys=True)


def cache_file(kind: str, key: Mapping[str, Any], directory: Path) -> Path:
    """The file that holds ``kind``'s data for ``key`` under ``directory``."""
    digest = hashlib.sha256(_key_text(kind, key).encode()).hexdigest()[:24]
    return directory / f"{kind}-{digest}.npz"


def _read(path: Path, key_text: str) -> Arrays | None:
    """The arrays stored at ``path`` if it holds exactly ``key_text``'s data, else None."""
    try:
        # Opened here, not by np.load, so the file is closed however the read fails.
        with path.open("rb") as fh:
            stored = np.load(fh, allow_pickle=False)
            if not isinstance(stored, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive")
            with stored:
                if _KEY_ENTRY not in stored.files or str(stored[_KEY_ENTRY]) != key_text:
                    log.warning("data cache: %s holds other data; generating it again", path)
                    return None
                return {name: stored[name] for name in stored.files if name != _KEY_ENTRY}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        log.warning("data cache: %s is unreadable (%s); generating it again", path, exc)
        return None


def _write(path: Path, key_text: str, arrays: Arrays) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                stored: dict[str, Any] = {**arrays, _KEY_ENTRY: np.array(key_text)}
                np.savez(fh, **stored)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        log.warning(
            "data cache: cannot write %s (%s); the data stays in memory only (set "
            "STAGETUNE_CACHE_DIR to a writable directory, or STAGETUNE_DATA_CACHE=false)",
            path,
            exc,
        )


def cached_arrays(
    kind: str,
    key: Mapping[str, Any],
    generate: Callable[[], Arrays],
    *,
    directory: Path | None = None,
) -> Arrays:
    """``generate()``'s arrays, read from the cache when a process of this machine already
    generated them for the same ``kind`` and ``key`` (JSON-serialisable: every argument the
    arrays depend on, including the generator's version), else generated and stored.

    ``directory`` defaults to :func:`data_cache_dir`; with the cache off this is
    ``generate()``."""
    where = directory if directory is not None else data_cache_dir()
    if where is None:
        return generate()
    key_text = _key_text(kind, key)
    path = cache_file(kind, key, where)
    found = _read(path, key_text)
    if found is not None:
        return found
    arrays = generate()
    if _KEY_ENTRY in arrays:
        raise ValueError(f"{_KEY_ENTRY!r} is reserved in the data cache")
    _write(path, key_text, arrays)
    return arrays
