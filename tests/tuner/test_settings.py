"""Settings from ``STAGETUNE_*`` variables: a bad value stops a command before it does
anything, with one line that names the variable, the value and the fix."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.cli import run_stagetune
from tests.environ import environ_without
from tuner.errors import ValidationError
from tuner.settings import Settings, env_var, misspelt_settings, read_settings


def test_env_var_of_a_setting() -> None:
    assert env_var("gang_idle_s") == "STAGETUNE_GANG_IDLE_S"
    assert env_var("data_cache") == "STAGETUNE_DATA_CACHE"


def test_bad_settings_name_each_variable_its_value_and_what_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no .env from the checkout
    monkeypatch.setenv("STAGETUNE_DATA_CACHE", "maybe")
    monkeypatch.setenv("STAGETUNE_PORT", "0")
    with pytest.raises(ValidationError) as raised:
        read_settings()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("invalid setting: STAGETUNE_DATA_CACHE='maybe': input should be")
    assert "(Cache generated task data on disk" in message
    assert "STAGETUNE_PORT='0': input should be greater than or equal to 1" in message
    assert message.endswith("Fix them in the environment or the .env file")


def test_a_bad_setting_in_the_env_file_is_named_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STAGETUNE_GANG_IDLE_S", raising=False)
    (tmp_path / ".env").write_text("STAGETUNE_GANG_IDLE_S=forever\n", encoding="utf-8")
    with pytest.raises(ValidationError, match="STAGETUNE_GANG_IDLE_S='forever': input should"):
        read_settings()
    (tmp_path / ".env").write_text("STAGETUNE_GANG_IDLE_S=5\n", encoding="utf-8")
    assert read_settings().gang_idle_s == 5.0


def _stagetune(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``stagetune ARGS`` in ``cwd`` with ``env`` and none of the caller's settings."""
    return run_stagetune(
        *args, cwd=cwd, env={**environ_without("RAY_", "STAGETUNE_"), **env}, timeout=120
    )


@pytest.mark.slow
@pytest.mark.ray_free
def test_stagetune_tune_with_a_bad_setting_stops_before_it_creates_a_study(
    tmp_path: Path,
) -> None:
    """Before, the study ran: every trial failed on the gang pool's variable, and the study
    was stored with no result."""
    (tmp_path / "spec.yaml").write_text(
        "task: digits\nbaselines: false\nschedule: {total_epochs: 1}\n"
        "budget: {trials: 2, recipe_candidates: false, seed_runs: 0}\n",
        encoding="utf-8",
    )
    done = _stagetune(tmp_path, {"STAGETUNE_GANG_IDLE_S": "soon"}, "tune", "spec.yaml")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("stagetune: error: invalid setting: STAGETUNE_GANG_IDLE_S='soon'")
    assert not (tmp_path / "stagetune-data").exists()  # no database, no study
    assert not (tmp_path / "best-schedule.yaml").exists()


def test_a_variable_that_looks_like_a_setting_is_named_with_the_setting() -> None:
    found = misspelt_settings(
        ["STAGETUNE_DATABASE", "stagetune_gang_idle", "STAGETUNE_DATASET_DIR", "PATH"]
    )
    assert found == {
        "STAGETUNE_DATABASE": "STAGETUNE_DATABASE_URL",
        "stagetune_gang_idle": "STAGETUNE_GANG_IDLE_S",
        "STAGETUNE_DATASET_DIR": "STAGETUNE_DATASETS_DIR",
    }


def test_no_variable_the_project_itself_uses_is_taken_for_a_typo() -> None:
    """The deployment's, the CLI's and the tests' own ``STAGETUNE_*`` variables (the role
    script's STAGETUNE_HOME, `serve`'s STAGETUNE_API_WORKERS, the client's STAGETUNE_URL...)
    are no settings, and must not be warned about."""
    repo = Path(__file__).resolve().parents[2]
    files = [
        repo / "deploy" / "stagetune-role",
        repo / "deploy" / ".env.example",
        repo / "docker-compose.yml",
        repo / "Dockerfile",
        *repo.glob("workers/**/*.py"),
        *repo.glob("api/**/*.py"),
        *repo.glob("tests/**/*.py"),
        *repo.glob("docs/*.md"),
        repo / "README.md",
    ]
    names = set()
    for path in files:
        names |= set(re.findall(r"STAGETUNE_[A-Z0-9_]*[A-Z0-9]", path.read_text("utf-8")))
    names -= set(TYPOS)
    assert {"STAGETUNE_HOME", "STAGETUNE_API_WORKERS", "STAGETUNE_URL"} <= names
    assert misspelt_settings(names) == {}


#: The typos this module's tests make on purpose.
TYPOS = ("STAGETUNE_DATABASE", "STAGETUNE_DATASET_DIR", "STAGETUNE_DATABSE_URL")


@pytest.mark.slow
@pytest.mark.ray_free
def test_the_cli_warns_of_a_misspelt_setting_and_goes_on(
    tmp_path: Path,
) -> None:
    done = _stagetune(tmp_path, {"STAGETUNE_DATABSE_URL": "sqlite://"}, "export", "1")
    warning, error = done.stderr.strip().splitlines()
    assert warning == (
        "stagetune: warning: STAGETUNE_DATABSE_URL is not a setting (ignored); did you mean "
        "STAGETUNE_DATABASE_URL?"
    )
    # it went on with the default database, which does not exist here
    assert done.returncode == 3
    assert error.startswith("stagetune: error: no study database at ")


def test_production_docs_list_every_setting_and_no_other() -> None:
    """docs/production.md's settings table is what operators read: one row per setting."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "production.md").read_text("utf-8")
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(STAGETUNE_[A-Z0-9_]+)` \|", section, flags=re.MULTILINE)
    assert sorted(rows) == sorted(env_var(field) for field in Settings.model_fields)
