"""Task options at submission: the published options models, the path policy of
:mod:`tuner.task_paths`, and tasks registered in the process. No torch here."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

import tuner.tasks
from tuner.errors import NotFoundError, StagetuneError, ValidationError
from tuner.settings import Settings, get_settings
from tuner.spec import StudySpec
from tuner.task_paths import DataPath, check_data_path, path_fields
from tuner.tasks import (
    available_tasks,
    options_model,
    register_task_name,
    unregister_task_name,
    validate_task_options,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A datasets root with one data directory, next to a directory outside it."""
    (tmp_path / "root" / "cifar" / "train").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return tmp_path / "root"


@pytest.fixture
def env_root(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``root`` as this process's datasets root (``STAGETUNE_DATASETS_DIR``)."""
    monkeypatch.setenv("STAGETUNE_DATASETS_DIR", str(root))
    get_settings.cache_clear()
    yield root
    get_settings.cache_clear()


# --------------------------------------------------------------------------------------------
# the path policy


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("cifar", "cifar"),
        ("cifar/train", "cifar/train"),
        ("./cifar/", "cifar"),
        ("not-there-yet", "not-there-yet"),  # the data may be mounted on the workers only
        (".", ""),
    ],
)
def test_relative_paths_resolve_inside_the_root(root: Path, value: str, expected: str) -> None:
    assert check_data_path(value, root=root) == (root / expected).resolve()


def test_absolute_paths_inside_the_root_are_accepted(root: Path) -> None:
    assert check_data_path(str(root / "cifar"), root=root) == (root / "cifar").resolve()
    assert check_data_path(str(root), root=root) == root.resolve()


def test_symlinks_that_stay_inside_the_root_are_accepted(root: Path) -> None:
    (root / "current").symlink_to(root / "cifar", target_is_directory=True)
    assert check_data_path("current/train", root=root) == (root / "cifar" / "train").resolve()


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("../outside", "'..' component"),
        ("cifar/../../outside", "'..' component"),
        ("cifar/..", "'..' component"),
        ("..\\outside", "'..' component"),
        ("~", "starts with '~'"),
        ("~root/.ssh", "starts with '~'"),
        ("file:///etc", "is a URL"),
        ("file:/etc", "is a URL"),
        ("FILE:etc", "is a URL"),
        ("http://example.com/cifar.tar.gz", "is a URL"),
        ("s3://bucket/cifar", "is a URL"),
        ("cifar\x00/etc", "NUL byte"),
        ("/etc", "is outside the datasets root"),
        ("/", "is outside the datasets root"),
    ],
)
def test_paths_breaking_a_rule_are_refused_naming_the_rule(
    root: Path, value: str, rule: str
) -> None:
    with pytest.raises(ValidationError) as info:
        check_data_path(value, option="task_options.data_dir", root=root)
    message = str(info.value)
    assert message.startswith("task_options.data_dir: ")
    assert rule in message
    assert "STAGETUNE_DATASETS_DIR" in message


def test_a_sibling_with_the_root_as_prefix_is_outside(root: Path) -> None:
    (root.parent / "root-evil").mkdir()
    with pytest.raises(ValidationError, match="outside the datasets root"):
        check_data_path(str(root.parent / "root-evil"), root=root)


def test_symlinks_leaving_the_root_are_refused(root: Path) -> None:
    outside = root.parent / "outside"
    (root / "escape").symlink_to(outside, target_is_directory=True)
    (root / "cifar" / "etc").symlink_to("/etc", target_is_directory=True)
    for value in ("escape", "escape/x", str(root / "escape"), "cifar/etc"):
        with pytest.raises(ValidationError, match="through a symlink") as info:
            check_data_path(value, option="task_options.data_dir", root=root)
        assert "STAGETUNE_DATASETS_DIR" in str(info.value)
        assert str(outside) not in str(info.value)  # where the link points is not disclosed


def test_a_root_behind_a_symlink_works(root: Path, tmp_path: Path) -> None:
    (tmp_path / "alias").symlink_to(root, target_is_directory=True)
    alias = tmp_path / "alias"
    assert check_data_path("cifar", root=alias) == (root / "cifar").resolve()
    assert check_data_path(str(alias / "cifar"), root=alias) == (root / "cifar").resolve()
    assert check_data_path(str(root / "cifar"), root=alias) == (root / "cifar").resolve()


def test_the_root_is_a_setting_defaulting_under_the_data_dir(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")  # type: ignore[call-arg]
    assert settings.resolved_datasets_dir == (tmp_path / "data" / "datasets").resolve()
    settings = Settings(_env_file=None, datasets_dir=tmp_path / "ds")  # type: ignore[call-arg]
    assert settings.resolved_datasets_dir == (tmp_path / "ds").resolve()


def test_check_data_path_reads_the_root_from_the_settings(env_root: Path) -> None:
    assert check_data_path("cifar") == (env_root / "cifar").resolve()
    with pytest.raises(ValidationError, match="outside"):
        check_data_path(str(env_root.parent / "outside"))


class _PathOptions(BaseModel):
    data_dir: DataPath = Field(description="Where the data is.")
    extra_dir: DataPath | None = None
    fallback: DataPath = "fallback"
    label: str = "not a path"


def test_path_options_are_found_by_their_type() -> None:
    assert path_fields(_PathOptions) == ["data_dir", "extra_dir", "fallback"]
    schema = _PathOptions.model_json_schema()["properties"]
    assert schema["data_dir"]["x-stagetune-path"] == "dataset"
    assert "x-stagetune-path" not in schema["label"]


# --------------------------------------------------------------------------------------------
# validate_task_options


def test_builtin_tasks_publish_their_options_models() -> None:
    published = {ep.name for ep in entry_points(group=tuner.tasks.OPTIONS_ENTRY_POINT_GROUP)}
    builtins = {"cifar10", "denoise", "digits", "mnist1d", "synthetic", "tinylm"}
    assert published == set(available_tasks()) >= builtins
    for name in published:
        model = options_model(name)
        assert model is not None
        assert model.__module__ == "workers.task_options"
    assert path_fields(options_model("cifar10")) == ["data_dir"]  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        options_model("no-such-task")


def test_valid_options_pass(env_root: Path) -> None:
    validate_task_options("cifar10", {"data_dir": "cifar", "depth": 8})
    validate_task_options("cifar10", {"data_dir": str(env_root / "cifar")})
    validate_task_options("digits", {"hidden_dim": 64})
    validate_task_options("digits", None)
    validate_task_options("mnist1d", {})


@pytest.mark.parametrize(
    ("task", "options", "expected"),
    [
        ("digits", {"bogus": 1}, ["task_options.bogus: unknown option", "hidden_dim"]),
        ("digits", {"data_dir": "/etc"}, ["task_options.data_dir: unknown option"]),
        ("digits", {"hidden_dim": 0}, ["task_options.hidden_dim: 0 is invalid", ">= 8"]),
        ("cifar10", {}, ["task_options.data_dir: is required"]),
        ("cifar10", {"data_dir": "/etc"}, ["task_options.data_dir: '/etc' is outside"]),
        ("cifar10", {"data_dir": "../x"}, ["task_options.data_dir:", "'..'"]),
        ("cifar10", {"data_dir": 7}, ["task_options.data_dir: 7 is invalid"]),
        (
            "cifar10",
            {"data_dir": "file:///etc", "depth": 21},
            ["task_options.depth: 21", "6n + 2", "task_options.data_dir: 'file:///etc' is a URL"],
        ),
        (
            "synthetic",
            {"num_samples": 10_000_000, "num_features": 1000},
            ["1 GiB"],
        ),
        ("digits", ["hidden_dim"], ["task_options: must be a mapping"]),
    ],
)
def test_bad_options_are_refused_naming_the_option(
    env_root: Path, task: str, options: object, expected: list[str]
) -> None:
    with pytest.raises(ValidationError) as info:
        validate_task_options(task, options)
    message = str(info.value)
    assert message.startswith(f"invalid options for task {task!r}: ")
    for text in expected:
        assert text in message


def test_the_datasets_root_can_be_passed_explicitly(root: Path) -> None:
    validate_task_options("cifar10", {"data_dir": str(root / "cifar")}, datasets_root=root)
    with pytest.raises(ValidationError, match="outside"):
        validate_task_options(
            "cifar10", {"data_dir": str(root / "cifar")}, datasets_root=root / "x"
        )


def test_study_spec_reports_option_problems_at_the_option(env_root: Path) -> None:
    spec = StudySpec.from_dict({"task": "cifar10", "task_options": {"data_dir": "cifar"}})
    assert spec.task_options == {"data_dir": "cifar"}  # stored as given, resolved on the worker
    with pytest.raises(ValidationError) as info:
        StudySpec.from_dict({"task": "cifar10", "task_options": {"data_dir": "/etc", "x": 1}})
    message = str(info.value)
    assert "task_options.x: unknown option of task 'cifar10'" in message
    assert "task_options.data_dir: '/etc' is outside the datasets root" in message
    with pytest.raises(ValidationError, match=r"task_options\.data_dir: is required"):
        StudySpec.from_dict({"task": "cifar10"})  # the default (no options) is checked too
    # An unknown task is reported as such, not as bad options.
    with pytest.raises(ValidationError) as info:
        StudySpec.from_dict({"task": "nope", "task_options": {"x": 1}})
    assert "unknown task 'nope'" in str(info.value)
    assert "task_options" not in str(info.value)


def _fake_entry_points(monkeypatch: pytest.MonkeyPatch, extra: dict[str, list[EntryPoint]]) -> None:
    real = entry_points

    def fake(group: str) -> list[EntryPoint]:
        return [*real(group=group), *extra.get(group, [])]

    monkeypatch.setattr(tuner.tasks, "entry_points", fake)


def test_a_task_without_published_options_is_checked_by_the_worker_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tasks = tuner.tasks.ENTRY_POINT_GROUP
    _fake_entry_points(
        monkeypatch, {tasks: [EntryPoint("ext-noopts", "ext_noopts_pkg:TASK", tasks)]}
    )
    assert options_model("ext-noopts") is None
    validate_task_options("ext-noopts", {"anything": "/etc"})
    assert (
        StudySpec.from_dict({"task": "ext-noopts", "task_options": {"a": 1}}).task == "ext-noopts"
    )


def test_a_broken_options_entry_point_is_an_installation_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tasks, opts = tuner.tasks.ENTRY_POINT_GROUP, tuner.tasks.OPTIONS_ENTRY_POINT_GROUP
    _fake_entry_points(
        monkeypatch,
        {
            tasks: [
                EntryPoint("ext-broken", "ext_broken_pkg:TASK", tasks),
                EntryPoint("ext-notamodel", "ext_broken_pkg:TASK", tasks),
            ],
            opts: [
                EntryPoint("ext-broken", "ext_broken_pkg_missing:Options", opts),
                EntryPoint("ext-notamodel", "os:sep", opts),
            ],
        },
    )
    with pytest.raises(StagetuneError, match="ext_broken_pkg_missing:Options") as info:
        validate_task_options("ext-broken", {})
    assert not isinstance(info.value, ValidationError)  # not the user's fault: not a 422
    with pytest.raises(StagetuneError, match="not a pydantic model"):
        validate_task_options("ext-notamodel", {})


class _InProcessOptions(BaseModel):
    model_config = {"extra": "forbid"}
    size: int = Field(default=1, ge=1, le=10)
    data_dir: DataPath | None = None


def test_in_process_task_names_are_accepted_with_their_options_model(env_root: Path) -> None:
    assert "inproc-task" not in available_tasks()
    register_task_name("inproc-task", _InProcessOptions)
    try:
        assert "inproc-task" in available_tasks()
        spec = StudySpec.from_dict({"task": "inproc-task", "task_options": {"size": 3}})
        assert spec.task_options == {"size": 3}
        validate_task_options("inproc-task", {"data_dir": "cifar"})
        with pytest.raises(ValidationError, match=r"task_options\.size"):
            StudySpec.from_dict({"task": "inproc-task", "task_options": {"size": 30}})
        with pytest.raises(ValidationError, match=r"task_options\.data_dir: '/etc' is outside"):
            validate_task_options("inproc-task", {"data_dir": "/etc"})
        register_task_name("inproc-task", None)  # no model: the worker checks
        validate_task_options("inproc-task", {"whatever": 1})
    finally:
        unregister_task_name("inproc-task")
    assert "inproc-task" not in available_tasks()
    with pytest.raises(ValidationError, match="unknown task"):
        StudySpec.from_dict({"task": "inproc-task"})


def test_validating_options_and_serving_the_api_import_no_torch(tmp_path: Path) -> None:
    """The API validates task options (the cifar10 path policy included) without importing
    training code: no torch, no NumPy, no task module."""
    code = (
        "import sys\n"
        "from tuner.settings import Settings\n"
        "from tuner.spec import StudySpec\n"
        "from tuner.tasks import validate_task_options\n"
        "validate_task_options('cifar10', {'data_dir': 'cifar-10-batches-py', 'depth': 8})\n"
        "for task in ('cifar10', 'denoise', 'digits', 'mnist1d', 'synthetic'):\n"
        "    try:\n"
        "        validate_task_options(task, {'bogus': 1})\n"
        "    except ValueError:\n"
        "        pass\n"
        "    else:\n"
        "        raise AssertionError(task)\n"
        "StudySpec.from_dict({'task': 'cifar10', 'task_options': {'data_dir': 'c'}})\n"
        "from api.app import create_app\n"
        "app = create_app(settings=Settings(_env_file=None, database_url='sqlite://'))\n"
        "app.state.store.close()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')\n"
        "             or m.startswith('workers.tasks'))\n"
        "assert not bad, bad[:10]\n"
    )
    env = {**os.environ, "STAGETUNE_DATASETS_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
