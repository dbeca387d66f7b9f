"""Commands that tune on this machine: ``tune`` (a spec file), ``demo`` (a built-in spec), and
``tasks`` (the tasks a study may name; with ``--task-file``, a dry run of the file's tasks).

Both use the embedded default: a SQLite database under the data directory and a local Ray
instance (or the cluster ``RAY_ADDRESS`` points at).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workers.cli.app import EXIT_INTERRUPTED, app

DEMO_SPEC = Path(__file__).resolve().parents[2] / "examples" / "mnist1d.yaml"


def _run_spec_file(
    spec_path: Path, out: Path, database_url: str | None, task_file: Path | None = None
) -> None:
    from tuner.errors import StagetuneError
    from tuner.settings import get_settings
    from tuner.spec import StudySpec
    from tuner.store.records import StudyStatus
    from workers.gang_pool import close_driver_pool
    from workers.runner import tune_spec

    if not spec_path.is_file():
        raise typer.BadParameter(f"spec file not found: {spec_path}", param_hint="SPEC")
    trainable = None
    if task_file is not None:
        from workers.tasks.task_file import load_task_file, trainable_with_tasks

        trainable = trainable_with_tasks(load_task_file(task_file))
    spec = StudySpec.from_yaml(spec_path.read_text(encoding="utf-8"))
    settings = get_settings()
    try:
        result = tune_spec(
            spec, database_url or settings.resolved_database_url, out, trainable=trainable
        )
    finally:
        close_driver_pool(wait_s=10, strict=False)  # its warm gangs end with the command
    reason = result.no_result_reason()
    if reason is not None:
        raise StagetuneError(reason)  # exit code 1: the run ended, without a schedule
    if result.status is StudyStatus.QUEUED:
        # Interrupted (Ctrl-C): queued again, no result yet; tune_spec printed how to resume.
        raise typer.Exit(EXIT_INTERRUPTED)


@app.command()
def tune(
    spec: Annotated[Path, typer.Argument(help="Study spec (YAML or JSON).", metavar="SPEC")],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Where to write the best schedule YAML.")
    ] = Path("best-schedule.yaml"),
    database_url: Annotated[
        str | None,
        typer.Option("--database-url", help="Study database (default: embedded SQLite)."),
    ] = None,
    task_file: Annotated[
        Path | None,
        typer.Option(
            "--task-file",
            help="A Python file defining your own task (a workers.tasks.BaseTask subclass); "
            "the spec's `task` may then name it. Local runs only (docs/own-task.md).",
        ),
    ] = None,
) -> None:
    """Run a tuning study locally and write the best schedule as YAML."""
    _run_spec_file(spec, out, database_url, task_file)


@app.command()
def demo(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Where to write the best schedule YAML.")
    ] = Path("best-schedule.yaml"),
) -> None:
    """Tune a real schedule for the mnist1d task in a few minutes and print it."""
    _run_spec_file(DEMO_SPEC, out, None)


def _options_text(schema: dict[str, object]) -> str:
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return "-"
    parts = []
    for name, field in props.items():
        default = field.get("default", "required") if isinstance(field, dict) else "?"
        parts.append(f"{name}={default}")
    return ", ".join(parts)


@app.command()
def tasks(
    task_file: Annotated[
        Path | None,
        typer.Option(
            "--task-file",
            help="Also list the tasks of this Python file, and check each: load its data and "
            "run its model on two samples (what `tune --task-file` does before a study).",
        ),
    ] = None,
) -> None:
    """List the tasks a study may name, with their defaults and options."""
    from workers.console import stdout_console
    from workers.tasks import list_tasks
    from workers.tasks.base import check_model

    checked = []
    if task_file is not None:
        from workers.tasks.task_file import load_task_file

        for task in load_task_file(task_file):
            data = task.load_data(None, seed=0)
            params = sum(p.numel() for p in check_model(task, None, data).parameters())
            checked.append(
                f"{task.name}: ready; data {data.num_train:,} train / {data.num_val:,} val / "
                f"{data.num_test:,} test samples of shape {tuple(data.input_shape)}, "
                + (f"{data.num_classes} classes" if data.num_classes else "its own loss")
                + f"; model {params:,} parameters"
            )
    console = stdout_console(highlight=False)
    for info in list_tasks():
        opt = info.default_optimizer
        console.print(
            f"[bold]{info.name}[/bold]: {info.default_epochs} epochs, base batch "
            f"{info.default_base_batch_size} at LR {info.default_base_lr:g}, {opt.name} "
            f"(momentum {opt.momentum:g}, weight decay {opt.weight_decay:g})"
        )
        console.print(f"  {info.description}")
        console.print(f"  options: {_options_text(info.options_schema)}")
        metrics = ", ".join(
            f"{name} ({way}{', primary' if name == info.primary_metric else ''})"
            for name, way in info.metrics.items()
        )
        console.print(f"  metrics: {metrics}")
    for line in checked:
        console.print(line)
    if task_file is None:
        console.print("your own task: stagetune tasks --task-file my_task.py (docs/own-task.md)")
