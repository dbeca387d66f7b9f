"""Service settings, read from ``STAGETUNE_*`` environment variables (and an optional ``.env``).

The embedded default keeps everything under ``./stagetune-data``: a SQLite database, Ray
Tune's experiment directories and the datasets root (``STAGETUNE_DATASETS_DIR``, default
``<STAGETUNE_DATA_DIR>/datasets``) that path-valued task options must stay inside. Data a
task generates is cached per machine under ``STAGETUNE_CACHE_DIR`` (default
``~/.cache/stagetune``; ``workers.tasks.disk_cache``).
Production points ``STAGETUNE_DATABASE_URL`` at PostgreSQL and ``RAY_ADDRESS`` (Ray's own
variable) at a cluster.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Annotated

import pydantic
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tuner.errors import ValidationError, field_problems

DEFAULT_DATA_DIR = Path("stagetune-data")
ENV_PREFIX = "STAGETUNE_"
#: Settings whose value an error message must not repeat.
SECRET_SETTINGS = frozenset({"api_tokens", "api_token"})


class Settings(BaseSettings):
    """Every setting of the service, with the environment variable that sets it."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    data_dir: Path = Field(
        default=DEFAULT_DATA_DIR, description="Where the embedded default keeps data."
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the study database; default: SQLite in data_dir.",
    )
    ray_storage_path: Path | None = Field(
        default=None, description="Ray Tune experiment directory; default: data_dir/ray."
    )
    datasets_dir: Path | None = Field(
        default=None,
        description="The datasets root: path-valued task options (cifar10's data_dir) must lie "
        "inside it; relative ones are resolved against it. Default: data_dir/datasets.",
    )
    cache_dir: Path | None = Field(
        default=None,
        description="Where data a task generates (mnist1d's splits) is cached on disk, shared "
        "by every process of the machine. Default: $XDG_CACHE_HOME/stagetune, else "
        "~/.cache/stagetune.",
    )
    data_cache: bool = Field(
        default=True,
        description="Cache generated task data on disk (false: every process generates it).",
    )

    # API
    api_tokens: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Bearer tokens accepted for writes (STAGETUNE_API_TOKENS, comma-separated).",
    )
    api_token: SecretStr | None = Field(
        default=None, description="A single bearer token (shorthand)."
    )
    protect_reads: bool = Field(default=False, description="Require the token for reads as well.")
    max_request_bytes: int = Field(
        default=1_000_000, gt=0, description="Largest accepted request body."
    )
    host: str = Field(default="127.0.0.1", description="The address `stagetune serve` binds.")
    port: int = Field(
        default=8000, ge=1, le=65535, description="The port `stagetune serve` listens on."
    )

    # Dispatcher
    heartbeat_s: float = Field(
        default=5.0, gt=0, description="How often a running study heartbeats."
    )
    stale_after_s: float = Field(
        default=60.0, gt=0, description="A running study whose heartbeat is older is taken over."
    )
    poll_s: float = Field(
        default=2.0, gt=0, description="How often an idle dispatcher looks for work."
    )
    ray_lost_s: float = Field(
        default=30.0,
        ge=0,
        allow_inf_nan=False,
        description="A dispatcher whose Ray cluster has not answered for this long while a "
        "study runs gives the study back to the queue and exits (0: never; Ray itself ends a "
        "driver that has lost its cluster after 60 s, with the study still claimed).",
    )

    # Trials (read where the trial actors run: on a cluster, the Ray nodes' environment)
    gang_idle_s: float = Field(
        default=60.0,
        ge=0,
        allow_inf_nan=False,  # the pool ends itself only after this long empty
        description="Seconds a CPU gang of worker processes, given back when its trial actor "
        "stops, waits in its driver's pool for the next Tune experiment before it is killed; "
        "0 turns the pool off.",
    )

    @field_validator("api_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: object) -> object:
        if isinstance(value, str):
            return [t.strip() for t in value.split(",") if t.strip()]
        return value

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'stagetune.db').resolve()}"

    @property
    def resolved_ray_storage_path(self) -> Path:
        return (self.ray_storage_path or self.data_dir / "ray").resolve()

    @property
    def resolved_datasets_dir(self) -> Path:
        """The datasets root as an absolute path, symlinks resolved."""
        return (self.datasets_dir or self.data_dir / "datasets").resolve()

    @property
    def resolved_cache_dir(self) -> Path:
        """The cache directory as an absolute path."""
        if self.cache_dir is not None:
            return self.cache_dir.expanduser().resolve()
        xdg = os.environ.get("XDG_CACHE_HOME")
        if xdg and Path(xdg).is_absolute():
            return (Path(xdg) / "stagetune").resolve()
        try:
            return (Path.home() / ".cache" / "stagetune").resolve()
        except RuntimeError:  # no home directory (a bare service account): beside the data
            return (self.data_dir / "cache").resolve()

    @property
    def tokens(self) -> list[str]:
        """Every accepted token (empty: the API is open)."""
        found = [t.get_secret_value() for t in self.api_tokens]
        if self.api_token is not None:
            found.append(self.api_token.get_secret_value())
        return found


def env_var(setting: str) -> str:
    """The environment variable of a setting (``gang_idle_s`` -> ``STAGETUNE_GANG_IDLE_S``)."""
    return f"{ENV_PREFIX}{setting.upper()}"


def read_settings() -> Settings:
    """The settings from this process's environment (and ``.env``), read now; bad values are
    a :class:`~tuner.errors.ValidationError` that names each one's variable, on one line."""
    try:
        return Settings()
    except pydantic.ValidationError as error:
        problems = []
        for problem in field_problems(error):
            field = str(problem.loc[0]) if problem.loc else ""
            hidden = field in SECRET_SETTINGS or not problem.has_input
            shown = "" if hidden else f"={problem.input!r}"
            message = problem.message[:1].lower() + problem.message[1:]
            described = Settings.model_fields.get(field)
            about = described.description if described is not None else None
            hint = f" ({about.rstrip('.')})" if about else ""
            problems.append(f"{env_var(field)}{shown}: {message}{hint}")
        which = "it" if len(problems) == 1 else "them"
        raise ValidationError(
            f"invalid setting: {'; '.join(problems)}. Fix {which} in the environment or the "
            ".env file"
        ) from None


def misspelt_settings(names: Iterable[str]) -> dict[str, str]:
    """The ``STAGETUNE_*`` names among ``names`` that are no setting but look like one (a
    typo, a missing ``_URL``), each with the setting's variable. Other ``STAGETUNE_*`` names
    (the deployment's, the client's ``STAGETUNE_URL``) are left alone."""
    known = {field: env_var(field) for field in Settings.model_fields}
    found = {}
    for name in names:
        if not name.upper().startswith(ENV_PREFIX):
            continue
        setting = name[len(ENV_PREFIX) :].lower()  # pydantic reads them in any case
        if setting in known:
            continue
        # cutoff 0.78: "database" for "database_url" (0.8) is caught, the CLI's own
        # STAGETUNE_API_WORKERS (0.76 to "api_tokens") is not (tested on every name the
        # project's files use)
        close = difflib.get_close_matches(setting, list(known), n=1, cutoff=0.78)
        if close:
            found[name] = known[close[0]]
    return found


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (cached; tests build ``Settings(...)`` directly)."""
    return read_settings()
