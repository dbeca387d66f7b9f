"""``stagetune export`` (a study's schedule as YAML, Megatron-LM arguments or DeepSpeed configs)
and ``stagetune replay`` (train an exported schedule once and compare with the recorded run)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from tuner.errors import NotFoundError, ValidationError
from workers.cli.app import app

#: ``--database-url`` of the commands that read the study database directly.
DatabaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="Study database (default: STAGETUNE_DATABASE_URL, else the embedded SQLite "
        "under ./stagetune-data).",
    ),
]


class ExportFormat(StrEnum):
    yaml = "yaml"
    megatron = "megatron"
    deepspeed = "deepspeed"


def open_study_database(database_url: str | None, *, or_service: bool = True) -> Any:
    """The study database at ``database_url`` (default: the settings'), which must exist:
    ``NotFoundError`` naming what to pass otherwise (``or_service``: the command also takes
    ``--url`` of a running service)."""
    from tuner.settings import get_settings
    from tuner.store import StudyStore
    from tuner.store.engine import display_url, normalize_url

    url = normalize_url(database_url or get_settings().resolved_database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        path = Path(os.path.expanduser(url.database))
        if not path.is_file():
            service = ", or --url of a running service" if or_service else ""
            raise NotFoundError(
                f"no study database at {path}; pass --database-url (or set "
                f"STAGETUNE_DATABASE_URL){service}"
            )
    try:
        return StudyStore.from_url(url)
    except Exception as exc:
        raise NotFoundError(f"cannot open the study database {display_url(url)}: {exc}") from exc


def _fetch(
    study: int, trial: int | None, database_url: str | None, url: str | None, token: str | None
) -> tuple[Any, str]:
    """The exported schedule, from the store or from a running service, and a line saying
    which it is."""
    from tuner.export import export_schedule
    from tuner.schedule import Schedule

    if url is not None:
        from workers.cli.client import ApiClient

        path = (
            f"/studies/{study}/schedule.yaml"
            if trial is None
            else f"/studies/{study}/trials/{trial}/schedule.yaml"
        )
        with ApiClient(url, token) as client:
            schedule = Schedule.from_yaml(client.request("GET", path).text)
        return schedule, _what(schedule, study, f"the service at {url}")
    from tuner.store.engine import display_url

    store = open_study_database(database_url)
    try:
        schedule = export_schedule(store, study, trial)
        return schedule, _what(schedule, study, f"the database {display_url(store.url)}")
    finally:
        store.close()


def _what(schedule: Any, study: int, source: str) -> str:
    """Which study and trial were exported, from where (the default database is the one in
    the current directory, which may not be the running service's): said once the export is
    written."""
    prov = schedule.provenance if isinstance(schedule.provenance, Mapping) else {}
    number = prov.get("trial_number")
    name = prov.get("study_name")
    what = f"study {study}" + (f" ({name})" if name else "")
    what += f", trial {number}" if number is not None else ""
    return f"exported {what} from {source}"


def _dataset_size(schedule: Any, given: int | None) -> int:
    """Training samples per epoch: ``--dataset-size``, else the task's training split."""
    if given is not None:
        return given
    prov = schedule.provenance if isinstance(schedule.provenance, Mapping) else {}
    task_name = prov.get("task")
    if not isinstance(task_name, str):
        raise ValidationError(
            "this format needs the dataset size (training samples per epoch) and the schedule "
            "names no task to load it from; pass --dataset-size N"
        )
    from workers.tasks import get_task

    task = get_task(task_name)
    options = prov.get("task_options") if isinstance(prov.get("task_options"), Mapping) else {}
    raw_seed = prov.get("seed")
    seed = raw_seed if isinstance(raw_seed, int) else 0
    typer.echo(f"loading task {task_name!r} to count its training samples...", err=True)
    return int(task.load_data(task.validate_options(options or {}), seed).num_train)


def _write(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ValidationError(f"cannot write {out}: {exc.strerror or exc}") from None
    typer.echo(f"written to {out}", err=True)


@app.command()
def export(
    study: Annotated[int, typer.Argument(help="Study id.", metavar="STUDY")],
    trial: Annotated[
        int | None, typer.Option("--trial", help="Trial number (default: the best trial).")
    ] = None,
    world_size: Annotated[
        int | None,
        typer.Option(
            "--world-size",
            min=1,
            help="Re-target to this many data-parallel workers (same global batches and LRs).",
        ),
    ] = None,
    micro_batch: Annotated[
        int | None,
        typer.Option(
            "--micro-batch", min=1, help="Most samples per worker per forward/backward pass."
        ),
    ] = None,
    fmt: Annotated[
        ExportFormat, typer.Option("--format", help="yaml, megatron or deepspeed.")
    ] = ExportFormat.yaml,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Write here instead of stdout (deepspeed: a directory, one config per stage).",
        ),
    ] = None,
    dataset_size: Annotated[
        int | None,
        typer.Option(
            "--dataset-size",
            min=1,
            help="Training samples per epoch for megatron/deepspeed (default: load the task).",
        ),
    ] = None,
    database_url: DatabaseUrlOption = None,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            envvar="STAGETUNE_URL",
            show_envvar=True,
            help="Fetch from a running stagetune service instead of the database.",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="STAGETUNE_API_TOKEN",
            show_envvar=True,
            help="Bearer token for --url.",
        ),
    ] = None,
) -> None:
    """Export a study's best (or --trial N) schedule with provenance, optionally re-targeted
    to other hardware or as Megatron-LM arguments / DeepSpeed configs.

    What a format cannot express is printed to stderr as warnings.
    """
    from tuner.emitters import deepspeed_files, emit_deepspeed, emit_megatron
    from tuner.export import render_yaml
    from tuner.retarget import retarget

    if micro_batch is not None and world_size is None and fmt is ExportFormat.yaml:
        raise typer.BadParameter("--micro-batch needs --world-size", param_hint="--micro-batch")
    schedule, exported = _fetch(study, trial, database_url, url, token)
    hint = schedule.placement
    workers = world_size or (hint.world_size if hint else 1)
    micro = micro_batch if micro_batch is not None else (hint.micro_batch if hint else None)
    if fmt is ExportFormat.yaml:
        if world_size is None:
            _write(render_yaml(schedule), out)
        else:
            placed = retarget(schedule, world_size, micro_batch)
            for line in placed.describe():
                typer.echo(line, err=True)
            _write(placed.to_yaml(), out)
        typer.echo(exported, err=True)
        return
    n = _dataset_size(schedule, dataset_size)
    if fmt is ExportFormat.megatron:
        result: Any = emit_megatron(schedule, n, workers, micro)
    else:
        result = emit_deepspeed(schedule, n, workers, micro)
    for text in result.limitations:
        typer.echo(f"warning: {text}", err=True)
    if fmt is ExportFormat.deepspeed and out is not None:
        _write_dir(deepspeed_files(result.artefact, result.limitations), out)
        typer.echo(exported, err=True)
        return
    if fmt is ExportFormat.deepspeed:
        typer.echo(
            "note: this is every stage's config in one document; --out DIR writes what "
            "DeepSpeed takes: one ds_config_stage<N>.json per stage and stages.json",
            err=True,
        )
    _write(result.text, out)
    typer.echo(exported, err=True)


def _write_dir(files: Mapping[str, str], out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ValidationError(f"cannot write to {out}: {exc.strerror or exc}") from None
    typer.echo(f"written to {out}/: {', '.join(sorted(files))}", err=True)


@app.command()
def replay(
    schedule_file: Annotated[
        Path, typer.Argument(help="Exported schedule YAML.", metavar="SCHEDULE.yaml")
    ],
    task: Annotated[
        str | None,
        typer.Option("--task", help="Task to train (default: the task in the provenance)."),
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", min=0, help="Seed (default: the trial's).")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", min=1, help="Data-parallel workers (default: as tuned)."),
    ] = None,
    micro_batch: Annotated[
        int | None,
        typer.Option("--micro-batch", min=1, help="Micro-batch (default: as tuned)."),
    ] = None,
    cpus_per_worker: Annotated[
        float, typer.Option("--cpus-per-worker", min=0.01, help="CPUs per worker.")
    ] = 1.0,
    gpus_per_worker: Annotated[
        float, typer.Option("--gpus-per-worker", min=0.0, help="GPUs per worker.")
    ] = 0.0,
    task_file: Annotated[
        Path | None,
        typer.Option(
            "--task-file",
            help="A Python file defining the task (as for `stagetune tune --task-file`), when "
            "the schedule was tuned on a task of your own.",
        ),
    ] = None,
    tolerance: Annotated[
        float | None,
        typer.Option(
            "--tolerance",
            min=0.0,
            help="Fail (exit 1) if the study's metric differs from the recorded value by more "
            "than this: percentage points for an accuracy, the metric's own units otherwise "
            "(e.g. a loss; dB for a PSNR).",
        ),
    ] = None,
) -> None:
    """Train an exported schedule once with the trials' code and compare the study's metric
    (validation accuracy for classification) with the value recorded in the YAML's
    provenance."""
    from tuner.formatting import format_metric, format_metric_delta, in_own_units
    from tuner.schedule import Schedule
    from workers.replay import metric_label, recorded_metric
    from workers.replay import replay as run_replay

    if not schedule_file.is_file():
        raise typer.BadParameter(
            f"schedule file not found: {schedule_file}", param_hint="SCHEDULE.yaml"
        )
    schedule = Schedule.load(schedule_file)
    tasks: list[Any] = []
    if task_file is not None:
        from workers.tasks.task_file import load_task_file

        tasks = list(load_task_file(task_file))  # registered here, sent to the workers
    metric = recorded_metric(schedule, task)
    label = metric_label(metric)

    def progress(m: dict[str, Any]) -> None:
        value = m.get(metric)
        shown = format_metric(
            value if isinstance(value, int | float) else None, metric, percent=True
        )
        typer.echo(
            f"epoch {m.get('epoch')}: batch {m.get('batch_size')}, lr {m.get('lr'):.4g}, "
            f"{label} {shown}",
            err=True,
        )

    typer.echo(f"replaying {schedule.summary()}", err=True)
    result = run_replay(
        schedule,
        task,
        seed=seed,
        workers=workers,
        micro_batch=micro_batch,
        cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
        on_epoch=progress,
        tasks=tasks,
    )
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
    typer.echo(result.summary())
    diff = result.difference
    if tolerance is not None:
        if diff is None:
            typer.echo(
                f"no recorded {metric_label(result.metric)} to compare with; --tolerance not "
                "checked",
                err=True,
            )
            raise typer.Exit(1)
        if abs(diff) > tolerance:
            by = format_metric_delta(abs(diff), result.metric).lstrip("+")
            if in_own_units(result.metric):
                by += f" ({metric_label(result.metric)}, in its own units)"
            typer.echo(f"the replay differs by {by}, more than --tolerance {tolerance:g}", err=True)
            raise typer.Exit(1)
