"""The task-package template (``examples/task-plugin``), installed for real (pip, its entry
points in the installed metadata): the API's checks find its task and options model by name
without importing torch, workers load and train it, and a study of it runs end to end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "examples" / "task-plugin"

pytestmark = pytest.mark.slow

CHECK = """
import json, sys
from tuner.errors import ValidationError
from tuner.spec import StudySpec
from tuner.tasks import available_tasks

out = {"listed": "wine-mlp" in available_tasks()}
StudySpec.from_dict({"task": "wine-mlp", "task_options": {"hidden_dim": 32}})
try:
    StudySpec.from_dict({"task": "wine-mlp", "task_options": {"hidden_dim": 2}})
except ValidationError as exc:
    out["bad_option"] = str(exc)
out["torch_imported_by_checks"] = "torch" in sys.modules

from workers.tasks import get_task
task = get_task("wine-mlp")
data = task.load_data({}, 0)
out["shapes"] = [data.num_train, list(task.build_model({})(data.val_x).shape)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template installed (``pip install``, no dependencies: stagetune is this checkout)
    into a directory of its own, from a copy (a build leaves files beside the sources)."""
    root = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(TEMPLATE, root / "src-copy")
    target = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--target", str(target), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    return target


def env_with(site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGETUNE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_the_installed_template_is_found_by_name(site: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        cwd=tmp_path,
        env=env_with(site),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["listed"]
    assert "task_options.hidden_dim" in out["bad_option"]
    assert ">= 4" in out["bad_option"]
    assert out["torch_imported_by_checks"] is False
    assert out["shapes"] == [108, [35, 3]]


def test_a_study_of_the_installed_template_runs(site: Path, tmp_path: Path) -> None:
    """``stagetune tune`` on a spec naming the package's task, nothing else given: the task
    comes from the installed entry points, in the CLI and in the Ray workers (a Ray instance
    of the command's own, started in the environment the package is installed in, as a
    worker image would be)."""
    (tmp_path / "spec.yaml").write_text(
        "task: wine-mlp\nschedule: {total_epochs: 2}\n"
        "space: {stages: {min: 1, max: 2}, batch_size: {min: 8, max: 64}}\n"
        "budget: {trials: 4, seed_runs: 0, early_stopping: false}\n",
        encoding="utf-8",
    )
    env = env_with(site)
    env.pop("RAY_ADDRESS", None)
    env["STAGETUNE_DATA_DIR"] = str(tmp_path / "data")
    done = subprocess.run(
        [sys.executable, "-c", "from workers.cli import main; main()", "tune", "spec.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert output.count(" completed: val_accuracy ") == 4, output[-4000:]
    assert (tmp_path / "best-schedule.yaml").exists()
