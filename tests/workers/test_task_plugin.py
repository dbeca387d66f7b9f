"""The task-package template (``examples/task-plugin``), installed for real (pip, its entry
points in the installed metadata): the API's checks find its task and options model by name
without importing torch, and a worker process loads the task, its data and its model by name
(what a trial's workers do; the trial loop itself is the one every task uses)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.environ import environ_without

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "examples" / "task-plugin"


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
    env = environ_without("STAGETUNE_")
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
