"""Your own task in a Python file (``stagetune tune --task-file``): what a file may define, the
errors that name what to fix, and a real study of the example task through the console
script, whose Ray workers receive the task by value."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.environ import environ_without
from tuner.errors import ValidationError
from tuner.spec import StudySpec
from workers.tasks import get_task, task_names, unregister_task
from workers.tasks.task_file import load_task_file

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "own-task"
STAGETUNE = Path(sys.executable).with_name("stagetune")

HEADER = """
from torch import nn
from workers.tasks import BaseTask, TaskData, TaskOptions
import torch
"""

TASK_CLASS = """
class Tiny(BaseTask[TaskOptions]):
    name = "{name}"
    description = "tiny"
    default_epochs = 2
    default_base_batch_size = 8
    default_base_lr = 0.1
    options_model = TaskOptions

    def _load(self, opts, data_seed):
        x = torch.randn(40, 3)
        y = torch.arange(40) % 2
        return TaskData(x, y, x, y, x, y, num_classes=2, input_shape=(3,))

    def _build(self, opts):
        return nn.Linear(3, 2)
"""


@pytest.fixture
def forget() -> Iterator[list[str]]:
    """Task names a test registered, unregistered afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        if name in task_names():
            unregister_task(name)


def write(tmp_path: Path, body: str, name: str = "user_task.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(HEADER) + textwrap.dedent(body), encoding="utf-8")
    return path


def test_the_example_task_file_registers_its_task(forget: list[str]) -> None:
    tasks = load_task_file(EXAMPLE / "my_task.py")
    forget.extend(t.name for t in tasks)
    assert [t.name for t in tasks] == ["my-digits-cnn"]
    assert get_task("my-digits-cnn") is tasks[0]
    # A spec of this process may name it, its options checked by the task's own model.
    spec = StudySpec.from_yaml((EXAMPLE / "spec.yaml").read_text(encoding="utf-8"))
    assert spec.task == "my-digits-cnn"
    with pytest.raises(ValidationError, match="channels"):
        StudySpec.from_dict({"task": "my-digits-cnn", "task_options": {"channels": 0}})
    data = tasks[0].load_data({}, 0)
    assert (data.num_train, data.num_val, data.input_shape) == (1079, 359, (1, 8, 8))


def test_a_task_class_and_an_instance_in_a_file_are_both_found(
    tmp_path: Path, forget: list[str]
) -> None:
    path = write(
        tmp_path,
        TASK_CLASS.format(name="tiny-a")
        + TASK_CLASS.format(name="tiny-b").replace("class Tiny(", "class TinyB(")
        + "\nB = TinyB()\n",
    )
    tasks = load_task_file(path)
    forget.extend(t.name for t in tasks)
    assert sorted(t.name for t in tasks) == ["tiny-a", "tiny-b"]
    # Loading the file again (an edited task) replaces the earlier registration.
    again = load_task_file(path)
    assert get_task("tiny-a") is next(t for t in again if t.name == "tiny-a")


@pytest.mark.parametrize(
    ("body", "file_name", "message"),
    [
        ("", "missing.py", "task file not found"),
        ("", "user_task.txt", "is not a Python file"),
        ("\nx = 1\nraise RuntimeError('no data here')\n", "user_task.py", r"line 7\): Runtime"),
        ("\nx = 1\n", "user_task.py", "defines no task: define a subclass"),
        (
            "\nclass Half(BaseTask[TaskOptions]):\n    name = 'half'\n",
            "user_task.py",
            "Half is abstract: implement _load",
        ),
        (TASK_CLASS.format(name="digits"), "user_task.py", "named 'digits', which is a built-in"),
        (
            TASK_CLASS.format(name="twin")
            + TASK_CLASS.format(name="twin").replace("class Tiny(", "class Other("),
            "user_task.py",
            "two tasks named 'twin'",
        ),
    ],
    ids=["not-found", "not-python", "import-error", "no-task", "abstract", "taken", "twins"],
)
def test_a_bad_task_file_gets_an_error_naming_the_file_and_the_fix(
    tmp_path: Path, body: str, file_name: str, message: str
) -> None:
    path = tmp_path / file_name
    if file_name != "missing.py":
        path = write(tmp_path, body, file_name)
    with pytest.raises(ValidationError, match=message) as info:
        load_task_file(path)
    assert str(path.name) in str(info.value)
    assert "digits" in task_names()  # a failed load registers nothing, breaks nothing
    assert "twin" not in task_names()


@pytest.mark.ray
@pytest.mark.slow
def test_stagetune_tune_runs_a_study_of_the_example_task_file(
    ray_session: None, tmp_path: Path
) -> None:
    """The README's command on a tiny budget, as the real console script from another
    directory: the workers cannot import the file, they get the task by value."""
    import ray

    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text(encoding="utf-8"))
    spec["schedule"]["total_epochs"] = 2
    spec["budget"] = {"trials": 4, "seed_runs": 0, "early_stopping": False, "max_concurrent": 2}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    env = environ_without("STAGETUNE_")
    env.update(
        STAGETUNE_DATA_DIR=str(tmp_path / "data"),
        RAY_ADDRESS=ray.get_runtime_context().gcs_address,
    )
    done = subprocess.run(
        [str(STAGETUNE), "tune", "spec.yaml", "--task-file", str(EXAMPLE / "my_task.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "on task my-digits-cnn" in output
    assert "objective: maximise final validation accuracy)" in output, output[:2000]
    assert output.count(" completed: val_accuracy ") == 4, output[-4000:]
    best = yaml.safe_load((tmp_path / "best-schedule.yaml").read_text(encoding="utf-8"))
    assert best["provenance"]["task"] == "my-digits-cnn"
    # The CNN learns in 2 epochs: the best trial is far above chance (0.1).
    assert "val_accuracy 0.9" in output or "val_accuracy 0.8" in output, output[-4000:]


def test_a_bad_task_file_fails_the_command_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "\nx = 1\n")
    done = subprocess.run(
        [str(STAGETUNE), "tune", str(EXAMPLE / "spec.yaml"), "--task-file", str(path)],
        cwd=tmp_path,
        env={**os.environ, "STAGETUNE_DATA_DIR": str(tmp_path / "data")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("stagetune: error: task file ")
    assert "defines no task" in done.stderr
    assert not (tmp_path / "best-schedule.yaml").exists()


BREAKS_IN_TRAINING = (
    TASK_CLASS.format(name="breaks-in-training").replace(
        "return nn.Linear(3, 2)", "return _Broken()"
    )
    + """

class _Broken(nn.Linear):
    def __init__(self):
        super().__init__(3, 2)

    def forward(self, x):
        if self.training:
            raise RuntimeError("mat1 and mat2 must have the same dtype")
        return super().forward(x)
"""
)


@pytest.mark.ray
@pytest.mark.slow
def test_a_study_whose_every_trial_fails_ends_with_an_error_saying_why(
    ray_session: None, tmp_path: Path
) -> None:
    """The model passes the check before the study (evaluation works) but fails in training:
    every trial fails with its reason, and the command exits 1 with those reasons instead of
    reporting success without a schedule."""
    import ray

    path = write(tmp_path, BREAKS_IN_TRAINING)
    (tmp_path / "spec.yaml").write_text(
        "task: breaks-in-training\nbaselines: false\nschedule: {total_epochs: 2}\n"
        "space: {batch_size: {min: 8, max: 16}}\n"
        "budget: {trials: 2, seed_runs: 0, early_stopping: false, max_failures: 0}\n",
        encoding="utf-8",
    )
    env = environ_without("STAGETUNE_")
    env.update(
        STAGETUNE_DATA_DIR=str(tmp_path / "data"),
        RAY_ADDRESS=ray.get_runtime_context().gcs_address,
    )
    done = subprocess.run(
        [str(STAGETUNE), "tune", "spec.yaml", "--task-file", str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 1, (done.stdout + done.stderr)[-4000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("stagetune: error: study 1 has no result: none of its 2 trials")
    assert "2x failed: " in last
    assert "mat1 and mat2 must have the same dtype" in last
    assert not (tmp_path / "best-schedule.yaml").exists()


def test_stagetune_tasks_lists_the_tasks_and_checks_a_task_file(tmp_path: Path) -> None:
    """``stagetune tasks``: the built-ins with their defaults; with ``--task-file``, the file's
    tasks too, each loaded and its model run once (a dry run before a study), and a broken
    model is the same one-line error as ``tune`` gives."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(STAGETUNE), "tasks", *args],
            cwd=tmp_path,
            env={**os.environ, "COLUMNS": "200", "STAGETUNE_DATA_DIR": str(tmp_path / "d")},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    plain = run()
    assert plain.returncode == 0, plain.stderr
    assert "mnist1d: 30 epochs, base batch 32 at LR 0.05, sgd" in plain.stdout
    assert "metrics: val_loss (min, primary), val_perplexity (min), val_accuracy (max)" in (
        plain.stdout
    )
    assert "my-digits-cnn" not in plain.stdout
    mine = run("--task-file", str(EXAMPLE / "my_task.py"))
    assert mine.returncode == 0, mine.stderr
    assert "options: data_seed=0, channels=16" in mine.stdout
    assert (
        "my-digits-cnn: ready; data 1,079 train / 359 val / 359 test samples of shape "
        "(1, 8, 8), 10 classes; model 9,930 parameters"
    ) in mine.stdout
    broken = write(tmp_path, TASK_CLASS.format(name="wrong-out").replace("(3, 2)", "(3, 5)"))
    bad = run("--task-file", str(broken))
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert bad.stderr.startswith("stagetune: error: task 'wrong-out': its model maps a batch")
