"""Commands that talk to a running stagetune service over HTTP: ``submit`` and ``status``.

The service is found at ``--url`` (default: ``STAGETUNE_URL``, else ``http://127.0.0.1:8000``);
writes carry ``--token`` (default: ``STAGETUNE_API_TOKEN``) as a bearer token. Every failure
ends the command through the app's error handling as one line with an exit code scripts can
test: 1 the service is unreachable, failed, or refused the token; 2 the spec (or another
input) is invalid; 3 no such study; 4 conflict or invalid state.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from tuner.errors import (
    ConflictError,
    InvalidStateError,
    NotFoundError,
    StagetuneError,
    ValidationError,
)
from tuner.formatting import one_line
from workers.cli.app import app
from workers.console import stdout_console

DEFAULT_URL: Final = "http://127.0.0.1:8000"
URL_ENV: Final = "STAGETUNE_URL"
TOKEN_ENV: Final = "STAGETUNE_API_TOKEN"
API_PREFIX: Final = "/api/v1"
REQUEST_TIMEOUT_S: Final = 30.0
#: While waiting, how long the service may stay unreachable before ``--wait`` gives up.
UNREACHABLE_GRACE_S: Final = 60.0

FINISHED: Final = frozenset({"completed", "failed", "cancelled"})
JSON_SUFFIXES: Final = frozenset({".json"})


class ServiceError(StagetuneError):
    """The service could not be reached, failed, or refused the request (exit code 1)."""


class UnreachableError(ServiceError):
    """No HTTP answer at all: connection refused, DNS, timeout."""


# --- HTTP ---------------------------------------------------------------------------------


def base_url(url: str) -> str:
    """The service root: ``http://host:8000/api/v1/`` and ``http://host:8000`` are the same."""
    root = url.strip().rstrip("/")
    if root.endswith(API_PREFIX):
        root = root[: -len(API_PREFIX)]
    if not root.startswith(("http://", "https://")):
        raise ValidationError(f"invalid --url {url!r}: expected http://HOST:PORT")
    return root


def _error_for(response: httpx.Response) -> StagetuneError:
    """The domain error for an HTTP error response (the API's ``{"error": {...}}`` body)."""
    status = response.status_code
    code = ""
    message = ""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        info = body["error"]
        code = str(info.get("code") or "")
        message = str(info.get("message") or "")
        details = info.get("details")
        if isinstance(details, list) and details and not _names_fields(message, details):
            message += " (" + "; ".join(_detail_text(d) for d in details) + ")"
    if not message:
        message = f"HTTP {status} {response.reason_phrase}: {one_line(response.text, 200)}"
    message = one_line(message)
    if status in (401, 403):
        return ServiceError(
            f"{message} (HTTP {status}); pass --token or set {TOKEN_ENV} to a token the "
            "service accepts"
        )
    if status == 404:
        return NotFoundError(message)
    if status == 409:
        return InvalidStateError(message) if code == "invalid_state" else ConflictError(message)
    if status in (400, 413, 415, 422):
        return ValidationError(message)
    return ServiceError(f"the service failed (HTTP {status}): {message}")


def _detail_text(detail: Any) -> str:
    if isinstance(detail, Mapping):
        field = str(detail.get("field") or "")
        text = str(detail.get("message") or "")
        return f"{field}: {text}" if field else text
    return str(detail)


def _names_fields(message: str, details: list[Any]) -> bool:
    """Whether ``message`` already names every field of ``details`` (the API's usual form)."""
    fields = [str(d.get("field") or "") for d in details if isinstance(d, Mapping)]
    return all(f in message for f in fields if f)


@dataclass
class ApiClient:
    """A thin client of the REST API under ``/api/v1``; raises domain errors, never httpx's."""

    url: str
    token: str | None = None
    timeout_s: float = REQUEST_TIMEOUT_S

    def __post_init__(self) -> None:
        self.url = base_url(self.url)
        headers = {"User-Agent": "stagetune-cli"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._http = httpx.Client(
            base_url=self.url + API_PREFIX, headers=headers, timeout=self.timeout_s
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.ConnectError as exc:
            reason = "connection refused" if "refused" in str(exc).lower() else one_line(str(exc))
            raise UnreachableError(
                f"cannot reach the stagetune service at {self.url} ({reason}); is "
                f"`stagetune serve` running there? Set --url or {URL_ENV}"
            ) from None
        except httpx.TimeoutException:
            raise UnreachableError(
                f"the stagetune service at {self.url} did not answer within {self.timeout_s:g} s"
            ) from None
        except httpx.HTTPError as exc:
            raise UnreachableError(
                f"request to {self.url} failed: {one_line(str(exc)) or type(exc).__name__}"
            ) from None
        if response.status_code >= 400:
            raise _error_for(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self.request(method, path, **kwargs)
        try:
            body = response.json()
        except ValueError:
            raise ServiceError(
                f"unexpected answer from {self.url}{API_PREFIX}{path}: not JSON "
                f"({one_line(response.text, 120)!r}); is --url a stagetune service?"
            ) from None
        if not isinstance(body, dict):
            raise ServiceError(f"unexpected answer from {self.url}{API_PREFIX}{path}: {body!r}")
        return body

    def submit(self, spec: bytes, content_type: str) -> dict[str, Any]:
        return self._json("POST", "/studies", content=spec, headers={"Content-Type": content_type})

    def study(self, study_id: int) -> dict[str, Any]:
        return self._json("GET", f"/studies/{study_id}")

    def studies(self, *, limit: int, statuses: list[str]) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if statuses:
            params["status"] = statuses
        return self._json("GET", "/studies", params=params)

    def cancel(self, study_id: int) -> dict[str, Any]:
        return self._json("POST", f"/studies/{study_id}/cancel")

    def delete(self, study_id: int) -> None:
        self.request("DELETE", f"/studies/{study_id}")

    def schedule_yaml(self, study_id: int) -> str:
        return self.request("GET", f"/studies/{study_id}/schedule.yaml").text


# --- presentation -------------------------------------------------------------------------


def _progress(study: Mapping[str, Any]) -> Mapping[str, Any]:
    progress = study.get("progress")
    return progress if isinstance(progress, Mapping) else {}


def best_text(study: Mapping[str, Any]) -> str:
    """``0.9412 (trial 3: 64@0-3 -> 256@3-8)``, ``0.9733 ± 0.0021 (mean of 3 fresh seeds,
    trial 0, small_batch baseline: 32@0-4)``, or ``-`` before any trial finished."""
    best = study.get("best")
    if not isinstance(best, Mapping):
        return "-"
    value = best.get("value")
    text = f"{value:.4g}" if isinstance(value, int | float) else "n/a"
    std, seeds = best.get("std"), best.get("seeds")
    where = f"trial {best.get('number')}"
    if isinstance(seeds, int) and seeds:
        text = f"{value:.4f}" if isinstance(value, int | float) else "n/a"
        if isinstance(std, int | float):
            text += f" ± {std:.4f}"
        where = f"mean of {seeds} fresh seeds, {where}"
    if best.get("baseline"):
        where += f", {best['baseline']} baseline"
    if best.get("schedule_summary"):
        where += f": {best['schedule_summary']}"
    return f"{text} ({where})"


def progress_line(study: Mapping[str, Any]) -> str:
    """One line of a study's state, as ``--wait`` prints it when not on a terminal."""
    p = _progress(study)
    return (
        f"study {study.get('id')}: {study.get('status')}, "
        f"trials {p.get('trials_done', 0)}/{p.get('budget', '?')} done, "
        f"{p.get('trials_running', 0)} running, best {best_text(study)}"
    )


def _print_study(study: Mapping[str, Any]) -> None:
    p = _progress(study)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    title = f"{study.get('id')}"
    if study.get("name"):
        title += f"  {escape(str(study['name']))}"  # a user's name may hold [brackets]
    grid.add_row("study", title)
    grid.add_row("task", str(study.get("task")))
    metric = study.get("metric")
    if isinstance(metric, str):  # the service's study metric (older services send none)
        better = "lower" if study.get("metric_direction") == "min" else "higher"
        grid.add_row("metric", f"{metric} ({better} is better)")
    status = str(study.get("status"))
    if study.get("cancel_requested") and status not in FINISHED:
        status += " (cancel pending: the worker stops it at its next check)"
    grid.add_row("status", status)
    grid.add_row(
        "progress",
        f"{p.get('trials_done', 0)}/{p.get('budget', '?')} trials done, "
        f"{p.get('trials_running', 0)} running, {p.get('trials_remaining', 0)} remaining",
    )
    grid.add_row("best", best_text(study))
    summary = study.get("summary")
    floor = summary.get("step_floor") if isinstance(summary, Mapping) else None
    if isinstance(floor, Mapping) and isinstance(floor.get("trial"), int):
        from tuner.noise_candidate import step_floor_text  # the search space's imports: lazily

        text = step_floor_text(floor, floor["trial"]).removeprefix("Step floor: ")
        grid.add_row(
            "step floor", f"[yellow]{text}[/yellow]" if floor.get("cap_below_floor") else text
        )
    for key in ("created_at", "started_at", "finished_at"):
        if study.get(key):
            grid.add_row(key.removesuffix("_at"), str(study[key]))
    if study.get("worker_id"):
        grid.add_row("worker", f"{study['worker_id']} (attempt {study.get('attempts', '?')})")
    if study.get("error"):
        # a queued study's error says why a worker gave it back without starting it
        label = "given back" if study.get("status") == "queued" else "error"
        grid.add_row(label, escape(one_line(str(study["error"]))))
    stdout_console().print(grid)


def _print_studies(page: Mapping[str, Any]) -> None:
    items = page.get("items")
    studies = items if isinstance(items, list) else []
    table = Table(title=None, show_edge=False, pad_edge=False)
    for column in ("ID", "NAME", "TASK", "STATUS", "TRIALS", "RUNNING", "BEST", "CREATED"):
        table.add_column(column, no_wrap=column != "BEST", overflow="fold")
    for study in studies:
        p = _progress(study)
        table.add_row(
            str(study.get("id")),
            escape(str(study.get("name") or "-")),
            str(study.get("task")),
            str(study.get("status")),
            f"{p.get('trials_done', 0)}/{p.get('budget', '?')}",
            str(p.get("trials_running", 0)),
            best_text(study),
            str(study.get("created_at") or "")[:19].replace("T", " "),
        )
    console = stdout_console()
    if not studies:
        console.print("no studies")
        return
    console.print(table)
    total = page.get("total")
    if isinstance(total, int) and total > len(studies):
        console.print(f"({len(studies)} of {total} studies; --limit shows more)")


# --- waiting ------------------------------------------------------------------------------


def wait_for(
    client: ApiClient,
    study_id: int,
    *,
    interval_s: float,
    timeout_s: float | None,
    on_update: Callable[[Mapping[str, Any]], None],
    sleep: Callable[[float], None] = time.sleep,
) -> Mapping[str, Any]:
    """Poll the study until it finishes; the service may be briefly unreachable meanwhile."""
    started = time.monotonic()
    unreachable_since: float | None = None
    while True:
        try:
            study = client.study(study_id)
        except UnreachableError:
            now = time.monotonic()
            unreachable_since = unreachable_since or now
            if now - unreachable_since > UNREACHABLE_GRACE_S:
                raise
        else:
            unreachable_since = None
            on_update(study)
            if study.get("status") in FINISHED:
                return study
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            raise ServiceError(
                f"gave up waiting for study {study_id} after {timeout_s:g} s; it goes on: "
                f"stagetune status {study_id}"
            )
        sleep(interval_s)


class _Display:
    """Shows a study's progress on stderr: a rich progress bar on a terminal, else lines."""

    def __init__(self, study: Mapping[str, Any]) -> None:
        self.console = Console(stderr=True)
        self.study = study
        self.last_line = ""
        self.last_best = "-"
        self.progress: Progress | None = None
        self.task: Any = None
        if self.console.is_terminal:
            # One short line; each new best (with its schedule) is printed above it.
            self.progress = Progress(
                SpinnerColumn(),
                TextColumn("study {task.fields[study]} {task.fields[status]}"),
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TextColumn("trials, {task.fields[running]} running"),
                TimeElapsedColumn(),
                TextColumn("best {task.fields[best]}"),
                console=self.console,
                transient=False,
            )

    def __enter__(self) -> _Display:
        if self.progress is not None:
            self.progress.start()
            self.task = self.progress.add_task(
                "study", total=None, study=self.study.get("id"), status="", running=0, best="-"
            )
            self.update(self.study)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, study: Mapping[str, Any]) -> None:
        if self.progress is None:
            line = progress_line(study)
            if line != self.last_line:
                print(line, file=sys.stderr, flush=True)
                self.last_line = line
            return
        p = _progress(study)
        best = best_text(study)
        if best not in ("-", self.last_best):
            self.progress.console.print(f"new best {best}", highlight=False)
            self.last_best = best
        best_value = study.get("best") or {}
        value = best_value.get("value") if isinstance(best_value, Mapping) else None
        self.progress.update(
            self.task,
            total=p.get("budget"),
            completed=p.get("trials_done", 0),
            status=str(study.get("status")),
            running=p.get("trials_running", 0),
            best=f"{value:.4g}" if isinstance(value, int | float) else "-",
        )


# --- commands -----------------------------------------------------------------------------

UrlOption = Annotated[
    str,
    typer.Option(
        "--url",
        envvar=URL_ENV,
        help="Root URL of the stagetune service.",
        show_envvar=True,
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=TOKEN_ENV,
        help="Bearer token for the API (needed for writes when the service has tokens).",
        show_envvar=True,
        show_default=False,
    ),
]


def _content_type(path: Path) -> str:
    return "application/json" if path.suffix.lower() in JSON_SUFFIXES else "application/yaml"


def _read_spec(path: Path) -> bytes:
    if not path.is_file():
        raise ValidationError(f"spec file not found: {path}")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValidationError(f"cannot read spec file {path}: {exc.strerror or exc}") from None


def _finish(client: ApiClient, study: Mapping[str, Any], out: Path | None) -> None:
    study_id = int(study["id"])
    status = study.get("status")
    if status == "failed":
        error = one_line(str(study.get("error") or "no error recorded"))
        raise ServiceError(f"study {study_id} failed: {error}")
    if status == "cancelled":
        raise ServiceError(f"study {study_id} was cancelled")
    schedule = client.schedule_yaml(study_id)
    print(f"study {study_id} completed; best {best_text(study)}", file=sys.stderr)
    if out is not None:
        out.write_text(schedule, encoding="utf-8")
        print(f"best schedule written to {out}", file=sys.stderr)
    else:
        sys.stdout.write(schedule if schedule.endswith("\n") else schedule + "\n")


@app.command()
def submit(
    spec: Annotated[
        Path, typer.Argument(help="Study spec: YAML, or JSON (.json).", metavar="SPEC")
    ],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Show progress until the study finishes, then print its best schedule "
            "(exit 1 if it failed or was cancelled).",
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="With --wait: write the best schedule here, not to stdout."
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="With --wait: seconds between polls.")
    ] = 2.0,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", min=0.0, help="With --wait: give up (exit 1) after this many seconds."
        ),
    ] = None,
) -> None:
    """Submit a study spec to a stagetune service and print the new study's id.

    With --wait, the id and the progress (trials done / budget, best so far) go to stderr.

    stdout then gets only the best schedule's YAML, so `submit --wait SPEC > best.yaml` works.
    """
    body = _read_spec(spec)
    with ApiClient(url, token) as client:
        study = client.submit(body, _content_type(spec))
        study_id = int(study["id"])
        if not wait:
            print(study_id)
            return
        print(f"submitted study {study_id} to {client.url}", file=sys.stderr)
        with _Display(study) as display:
            final = wait_for(
                client,
                study_id,
                interval_s=interval,
                timeout_s=timeout,
                on_update=display.update,
            )
        _finish(client, final, out)


@app.command()
def status(
    study: Annotated[
        int | None,
        typer.Argument(help="A study id: show its progress and best; omit to list studies."),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    state: Annotated[
        list[str] | None,
        typer.Option("--status", help="When listing: only studies in this status (repeatable)."),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=500, help="When listing: at most this many.")
    ] = 20,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the service's JSON instead of a table.")
    ] = False,
) -> None:
    """Show the studies of a stagetune service (newest first), or one study's progress."""
    with ApiClient(url, token) as client:
        if study is None:
            page = client.studies(limit=limit, statuses=list(state or []))
            if as_json:
                print(json.dumps(page, indent=2))
            else:
                _print_studies(page)
            return
        detail = client.study(study)
        if as_json:
            print(json.dumps(detail, indent=2))
        else:
            _print_study(detail)


@app.command()
def cancel(
    study: Annotated[int, typer.Argument(help="The id of the study to cancel.")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Cancel a study: a queued one at once, a running one at its worker's next check (its
    trials so far and the summary of what ran are kept)."""
    with ApiClient(url, token) as client:
        detail = client.cancel(study)
    status = str(detail.get("status"))
    if status == "cancelled":
        print(f"study {study} cancelled")
    else:
        print(
            f"study {study}: cancel requested; it is {status} until its worker stops it at the "
            f"next check (`stagetune status {study}` shows when)"
        )


@app.command()
def delete(
    study: Annotated[int, typer.Argument(help="The id of the study to delete.")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="Delete from this study database directly instead of through a service (e.g. "
            "the embedded sqlite:///stagetune-data/stagetune.db of `stagetune tune`), and "
            "remove the study's files under the Ray storage path at once.",
        ),
    ] = None,
) -> None:
    """Delete a study with its trials and metrics. A running study must be cancelled first
    (`stagetune cancel`).

    Its Ray Tune files (experiment, checkpoints, seed runs, stage-boundary states) go too.

    A worker of the service removes them and the Optuna study when it next looks for work.

    With --database-url, this command removes them at once.
    """
    if database_url is not None:
        _delete_from_database(study, database_url)
        return
    with ApiClient(url, token) as client:
        client.delete(study)
    print(
        f"study {study} deleted; a worker of the service removes its files from the Ray "
        "storage path when it next looks for work"
    )


def _delete_from_database(study: int, database_url: str) -> None:
    """``delete --database-url``: the study goes from the database, then its files from the
    storage path of this machine's settings (``STAGETUNE_RAY_STORAGE_PATH``, else
    ``<STAGETUNE_DATA_DIR>/ray``). Finding none there, the record stays for a worker that
    shares the storage path where the study ran."""
    from tuner.formatting import format_bytes
    from tuner.leftovers import remove_leftovers, study_files
    from tuner.settings import get_settings
    from workers.cli.export import open_study_database

    storage = get_settings().resolved_ray_storage_path
    store = open_study_database(database_url, or_service=False)
    try:
        store.delete_study(study)
        left = store.study_leftovers(study_id=study)
        if not left or not study_files(storage, left[0].experiment):
            print(
                f"study {study} deleted; no files of it under {storage} (a study that never "
                "ran has none; one that ran with another storage path has its files removed by "
                "a `stagetune worker` that uses that path, at its next look for work)"
            )
            return
        removal = remove_leftovers(store, storage, study_id=study)
    finally:
        store.close()
    if study in removal.failed:
        print(
            f"study {study} deleted, but its files under {storage} could not all be removed: "
            f"{removal.failed[study]}; `stagetune worker --once` with this database tries "
            "again",
            file=sys.stderr,
        )
        raise typer.Exit(1)
    paths = removal.paths_removed
    print(
        f"study {study} deleted, and its files under {storage}: {paths} "
        f"path{'s' if paths != 1 else ''}, {format_bytes(removal.bytes_freed)}"
    )
