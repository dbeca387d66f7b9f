"""``stagetune submit`` and ``stagetune status`` against a real API server.

The server is ``api.app:create_app`` under uvicorn in its own process (a temporary SQLite
database, a bearer token); every command runs as the real ``stagetune`` console script, so
exit codes and stderr are what a shell script sees. Studies are moved along "by hand" through
the store, as a dispatcher would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.environ import environ_without
from tuner.engine import RAY_AUTH_DEFAULT_NOTICE
from tuner.noise_candidate import noise_scale_step_floor
from tuner.schedule import Schedule, Stage
from tuner.store import StudyStatus, StudyStore, TrialStatus, experiment_name

# Every test here but the one marked ray talks to an API server without a dispatcher: no Ray.
pytestmark = [pytest.mark.slow, pytest.mark.ray_free]

REPO = Path(__file__).resolve().parents[2]
STAGETUNE = Path(sys.executable).with_name("stagetune")
TOKEN = "cli-test-token"

SPEC = """\
task: digits
name: {name}
schedule: {{total_epochs: 4}}
budget: {{trials: 6}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Server:
    url: str
    database_url: str


def _stop(process: subprocess.Popen[Any]) -> None:
    """Stop the process group of ``process`` (SIGTERM, then SIGKILL after 10 s)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _serve(tmp_path_factory.mktemp("cli-server"))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A server with a database of its own: the test may claim the oldest queued study."""
    yield from _serve(tmp_path)


def _serve(workdir: Path) -> Iterator[Server]:
    database_url = f"sqlite:///{workdir / 'stagetune.db'}"
    port = free_port()
    env = {
        **os.environ,
        "STAGETUNE_DATABASE_URL": database_url,
        "STAGETUNE_API_TOKEN": TOKEN,
        "STAGETUNE_DATA_DIR": str(workdir / "data"),
    }
    log = (workdir / "server.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "api.app:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=workdir,  # no developer's .env is read
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (workdir / "server.log").read_text()
            try:
                if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the API server did not come up in 60 s"
            time.sleep(0.2)
        yield Server(url=url, database_url=database_url)
    finally:
        _stop(process)
        log.close()


def cli_env(token: str | None = TOKEN, **extra: str) -> dict[str, str]:
    env = environ_without("STAGETUNE_")
    env.update({"COLUMNS": "200", "NO_COLOR": "1"})
    if token is not None:
        env["STAGETUNE_API_TOKEN"] = token
    env.update(extra)
    return env


def stagetune(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(STAGETUNE), *args],
        env=env if env is not None else cli_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write_spec(tmp_path: Path, name: str, text: str | None = None) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text if text is not None else SPEC.format(name=name), encoding="utf-8")
    return path


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    return lines[0]


# --- submit and status --------------------------------------------------------------------


def test_submit_prints_the_id_and_status_shows_the_study(
    module_server: Server, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, "cli-listed")
    done = stagetune("submit", str(spec), "--url", module_server.url)
    assert done.returncode == 0, done.stderr
    study_id = int(done.stdout.strip())  # stdout is the id alone: $(stagetune submit ...)

    with StudyStore(module_server.database_url) as store:
        study = store.get_study(study_id)
    assert (study.name, study.task, study.status) == ("cli-listed", "digits", "queued")

    listed = stagetune("status", "--url", module_server.url)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "cli-listed" in line)
    assert row.split()[0] == str(study_id)
    assert "queued" in row
    assert "0/6" in row

    one = stagetune("status", str(study_id), "--url", module_server.url)
    assert one.returncode == 0, one.stderr
    assert "queued" in one.stdout
    assert "0/6 trials done, 0 running, 6 remaining" in one.stdout
    assert "val_accuracy (higher is better)" in one.stdout  # the study's metric

    as_json = stagetune("status", str(study_id), "--json", "--url", module_server.url)
    assert json.loads(as_json.stdout)["id"] == study_id


def test_status_shows_a_name_with_brackets_as_it_is(module_server: Server, tmp_path: Path) -> None:
    """A study's name is the user's text: ``[wip]`` is not a style to drop."""
    text = SPEC.format(name="'[wip] lr sweep'")
    spec = write_spec(tmp_path, "bracketed", text)
    done = stagetune("submit", str(spec), "--url", module_server.url)
    assert done.returncode == 0, done.stderr
    study_id = done.stdout.strip()
    listed = stagetune("status", "--url", module_server.url)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.split()[:1] == [study_id])
    assert "[wip] lr sweep" in row
    one = stagetune("status", study_id, "--url", module_server.url)
    assert one.returncode == 0, one.stderr
    assert f"{study_id}  [wip] lr sweep" in one.stdout


def test_url_comes_from_the_environment(module_server: Server, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "cli-env-url")
    done = stagetune("submit", str(spec), env=cli_env(STAGETUNE_URL=module_server.url))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().isdigit()


def test_a_bad_spec_exits_2_with_one_line_naming_the_field(
    module_server: Server, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, "bad", "task: digits\nbudget: {trials: 0}\n")
    done = stagetune("submit", str(spec), "--url", module_server.url)
    assert done.returncode == 2
    assert done.stdout == ""
    line = one_line(done.stderr)
    assert line.startswith("stagetune: error: ")
    assert "budget.trials" in line

    typo = write_spec(tmp_path, "typo", "task: digits\nbugdet: {trials: 6}\n")
    done = stagetune("submit", str(typo), "--url", module_server.url)
    assert done.returncode == 2
    assert "bugdet" in one_line(done.stderr)

    missing = stagetune("submit", str(tmp_path / "nope.yaml"), "--url", module_server.url)
    assert missing.returncode == 2
    assert "spec file not found" in one_line(missing.stderr)


def test_a_json_spec_is_sent_as_json(module_server: Server, tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"task": "digits", "budget": {"trials": 0}}), encoding="utf-8")
    done = stagetune("submit", str(spec), "--url", module_server.url)
    assert done.returncode == 2
    assert "budget.trials" in one_line(done.stderr)
    spec.write_text(json.dumps({"task": "digits", "name": "cli-json"}), encoding="utf-8")
    done = stagetune("submit", str(spec), "--url", module_server.url)
    assert done.returncode == 0, done.stderr


def test_connection_refused_is_one_line_with_exit_1(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spec = write_spec(tmp_path, "nowhere")
    for args in (("submit", str(spec)), ("status",), ("status", "1")):
        done = stagetune(*args, "--url", url)
        assert done.returncode == 1, args
        line = one_line(done.stderr)
        assert url in line
        assert "connection refused" in line


def test_a_wrong_or_missing_token_is_one_line_with_exit_1(
    module_server: Server, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, "no-token")
    for env in (cli_env(token="wrong"), cli_env(token=None)):
        done = stagetune("submit", str(spec), "--url", module_server.url, env=env)
        assert done.returncode == 1
        line = one_line(done.stderr)
        assert "401" in line
        assert "--token" in line
    # reads need no token on this server
    assert stagetune("status", "--url", module_server.url, env=cli_env(token=None)).returncode == 0


def test_an_unknown_study_exits_3(module_server: Server) -> None:
    done = stagetune("status", "987654", "--url", module_server.url)
    assert done.returncode == 3
    assert "987654" in one_line(done.stderr)


def test_cancel_and_delete_through_the_cli(server: Server, tmp_path: Path) -> None:
    """A queued study is cancelled at once and can be deleted; a running one is only asked to
    stop: status says the cancel is pending, and deleting it says how to go on."""
    queued = int(stagetune("submit", str(write_spec(tmp_path, "q")), "--url", server.url).stdout)
    running = int(stagetune("submit", str(write_spec(tmp_path, "r")), "--url", server.url).stdout)
    with StudyStore(server.database_url) as store:
        claimed = store.claim_study("cli-test-worker", 60)  # the oldest queued: "q"
        assert claimed is not None
        assert claimed.id == queued
        claimed = store.claim_study("cli-test-worker", 60)
        assert claimed is not None
        assert claimed.id == running
        # "q" is queued again: its worker could not start it
        store.release_study(queued, "cli-test-worker", "not started: Ray down at head:6379")

    shown = stagetune("status", str(queued), "--url", server.url)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"given back\s+not started: Ray down at head:6379", shown.stdout), shown.stdout
    done = stagetune("cancel", str(queued), "--url", server.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"study {queued} cancelled"
    done = stagetune("delete", str(queued), "--url", server.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"study {queued} deleted; a worker of the service removes")
    assert stagetune("status", str(queued), "--url", server.url).returncode == 3

    refused = stagetune("delete", str(running), "--url", server.url)
    assert refused.returncode != 0
    assert f"`stagetune cancel {running}`" in one_line(refused.stderr)
    assert "request_cancel" not in refused.stderr
    done = stagetune("cancel", str(running), "--url", server.url)
    assert done.returncode == 0, done.stderr
    assert f"study {running}: cancel requested; it is running until its worker" in done.stdout
    shown = stagetune("status", str(running), "--url", server.url)
    assert "running (cancel pending" in shown.stdout
    with StudyStore(server.database_url) as store:
        assert store.get_study(running).cancel_requested


def test_status_shows_the_step_floor_of_a_finished_study(server: Server, tmp_path: Path) -> None:
    """The study summary's step floor (the runner writes it when a study ends): one row of
    ``stagetune status ID``, the sentence the CLI's result and the study page show."""
    study_id = int(stagetune("submit", str(write_spec(tmp_path, "f")), "--url", server.url).stdout)
    floor = noise_scale_step_floor([(32, 64, 32.0), (32, 128, 96.0)])
    assert floor is not None
    with StudyStore(server.database_url) as store:
        claimed = store.claim_study("cli-test-worker", 60)
        assert claimed is not None
        assert claimed.id == study_id
        summary = {"step_floor": {"trial": 0, **floor.to_dict(40)}}
        store.finish_study(study_id, StudyStatus.COMPLETED, summary=summary)
    shown = stagetune("status", str(study_id), "--url", server.url)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert (
        "step floor by its measured noise scale (McCandlish et al.), the progress the small "
        "batch (#0) made in 128 steps takes at least ~48 steps at any batch" in text
    ), shown.stdout
    assert "This study's step cap (40) is below the floor" in text


def test_every_command_has_help() -> None:
    for command in ("submit", "status", "cancel", "delete", "export"):
        done = stagetune(command, "--help")
        assert done.returncode == 0
        assert "--url" in done.stdout
        assert "[env var: STAGETUNE_URL]" in done.stdout


ALL_COMMANDS = (
    "", "submit", "status", "cancel", "delete", "export", "replay", "tune", "demo", "tasks",
    "worker", "serve", "storage",
)  # fmt: skip


def test_help_has_one_style() -> None:
    """Every command's --help: no Python types as metavars (``<bool>``, ``<list[str]>``), a
    value shown by its name in capitals, environment variables shown one way."""
    for command in ALL_COMMANDS:
        done = stagetune(*([command] if command else []), "--help")
        assert done.returncode == 0, done.stderr
        text = done.stdout
        assert not re.search(r"<(bool|str|int|float|list|path)", text), (command, text)
        assert not re.search(r"\(STAGETUNE_[A-Z_]+\)", text), (command, text)
        for line in text.splitlines():
            if re.search(r"--help\b", line):
                assert "bool" not in line.lower()
    export = stagetune("export", "--help").stdout
    assert re.search(r"--world-size\s+WORLD_SIZE", export)
    assert re.search(r"Usage: stagetune export \[OPTIONS\] \W?STUDY", export)


def test_the_command_list_gives_each_command_one_unbroken_summary() -> None:
    """``stagetune --help`` on a wide terminal: each command's summary on its own line,
    not cut where its docstring's source line ended (``... next check (its`` / ``trials so
    far ...``)."""
    done = stagetune("--help", env={**cli_env(), "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    lines = {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^│ (\w+)\s{2,}(.*?)│?$", done.stdout, re.M)
    }
    assert set(ALL_COMMANDS) - {""} <= set(lines), done.stdout
    assert lines["cancel"].endswith("(its trials so far and the summary of what ran are kept).")
    assert lines["delete"].endswith("must be cancelled first (`stagetune cancel`).")
    assert lines["replay"].endswith("recorded in the YAML's provenance.")


def test_each_commands_help_keeps_its_sentences_whole() -> None:
    """On a wide terminal, every line of a command's description ends a sentence: a help
    paragraph's text is not cut where its docstring's source line ended (``... best so far),``
    / ``and stdout gets ...``)."""
    for command in ALL_COMMANDS:
        done = stagetune(
            *([command] if command else []), "--help", env={**cli_env(), "COLUMNS": "200"}
        )
        assert done.returncode == 0, done.stderr
        before_boxes = done.stdout.split("╭", 1)[0]
        description = [
            line.strip()
            for line in before_boxes.splitlines()
            if line.strip() and not line.strip().startswith("Usage:")
        ]
        assert description, (command, done.stdout)
        for line in description:
            assert line.endswith((".", ":", ")")), (command, line)


def test_a_command_that_exits_with_a_code_makes_the_process_exit_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The console entry point: a command ending in ``typer.Exit(code)`` (``replay
    --tolerance`` beyond the tolerance, an interrupted ``tune``) exits the process with that
    code, not 0 (click, without standalone mode, returns it instead of exiting)."""
    import typer

    from workers.cli.app import app, main

    @app.command("exit-with")
    def exit_with(code: int) -> None:
        raise typer.Exit(code)

    try:
        for code in (1, 130):
            monkeypatch.setattr(sys, "argv", ["stagetune", "exit-with", str(code)])
            with pytest.raises(SystemExit) as exited:
                main()
            assert exited.value.code == code
        monkeypatch.setattr(sys, "argv", ["stagetune", "exit-with", "0"])
        main()  # returns: the process exits 0
    finally:
        app.registered_commands.pop()


def test_a_bad_option_value_is_a_usage_error_with_exit_2() -> None:
    done = stagetune("status", "--limit", "0", "--url", "http://127.0.0.1:9")
    assert done.returncode == 2
    assert "Invalid value for '--limit'" in done.stderr
    assert "Try 'stagetune status --help' for help." in done.stderr


# --- submit --wait ------------------------------------------------------------------------


def _schedule(*batches: int) -> dict[str, Any]:
    stages = tuple(
        Stage(start_epoch=2 * i, end_epoch=2 * (i + 1), batch_size=b) for i, b in enumerate(batches)
    )
    return Schedule(stages=stages, base_lr=0.1, base_batch_size=batches[0]).to_dict()


def _claim(store: StudyStore, process: subprocess.Popen[str]) -> int:
    """Claim the study the waiting ``submit`` created (the only one in the database)."""
    deadline = time.monotonic() + 30
    while (claimed := store.claim_study("cli-test-worker", 60)) is None:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "submit --wait created no study"
        time.sleep(0.1)
    return claimed.id


def _wait_in_background(server: Server, spec: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            str(STAGETUNE),
            "submit",
            str(spec),
            "--url",
            server.url,
            "--wait",
            "--interval",
            "0.2",
            "--timeout",
            "120",
        ],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _communicate(process: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"submit --wait did not finish:\n{out}\n{err}")


def test_wait_shows_progress_and_prints_the_best_schedule(server: Server, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "cli-wait")
    process = _wait_in_background(server, spec)
    try:
        with StudyStore(server.database_url) as store:
            study_id = _claim(store, process)
            time.sleep(0.5)  # let a poll see it running
            best_schedule = _schedule(32, 128)
            for number, (batches, accuracy) in enumerate([((32, 64), 0.81), ((32, 128), 0.93)]):
                trial = store.create_trial(study_id, number, _schedule(*batches), {"n": number})
                for epoch in range(4):
                    store.add_epoch_metrics(trial.id, epoch, {"val_accuracy": accuracy})
                store.finish_trial(
                    trial.id, TrialStatus.COMPLETED, final={"val_accuracy": accuracy}
                )
                if number == 1:
                    store.set_best(study_id, trial.id, accuracy)
                time.sleep(0.5)
            store.finish_study(study_id, StudyStatus.COMPLETED)
        out, err = _communicate(process)
    finally:
        _stop(process)

    assert process.returncode == 0, err
    assert f"submitted study {study_id}" in err
    assert f"study {study_id}: running, trials 0/6 done" in err
    assert "trials 2/6 done" in err
    assert f"study {study_id} completed; best 0.93 (trial 1" in err
    # stdout is the best schedule's YAML and nothing else
    document = yaml.safe_load(out)
    assert [s["batch_size"] for s in document["stages"]] == [
        s["batch_size"] for s in best_schedule["stages"]
    ]
    assert document["provenance"]["study_id"] == study_id


def test_wait_exits_1_when_the_study_fails(server: Server, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "cli-wait-fails")
    process = _wait_in_background(server, spec)
    try:
        with StudyStore(server.database_url) as store:
            study_id = _claim(store, process)
            store.finish_study(study_id, StudyStatus.FAILED, error="task exploded: out of memory")
        out, err = _communicate(process)
    finally:
        _stop(process)
    assert process.returncode == 1
    assert out == ""
    last = err.strip().splitlines()[-1]
    assert last == f"stagetune: error: study {study_id} failed: task exploded: out of memory"


# --- acceptance: a real study through `stagetune serve` -------------------------------------

DIGITS_EXAMPLE = REPO / "examples" / "digits.yaml"
MARKER_VAR = "STAGETUNE_CLI_TEST_RUN"


def _marked(marker: str) -> list[int]:
    """Live processes that carry ``marker`` in their environment (all the test started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{MARKER_VAR}={marker}".encode() in environ:
            found.append(int(entry.name))
    return found


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_submit_wait_against_serve_prints_progress_and_the_best_schedule(tmp_path: Path) -> None:
    """``stagetune submit examples/digits.yaml --wait`` against ``stagetune serve`` (API and
    embedded dispatcher on a local Ray instance) runs the study for real."""
    marker = uuid.uuid4().hex
    port = free_port()
    clean = environ_without("RAY_", "STAGETUNE_")
    env = {
        **clean,
        MARKER_VAR: marker,
        "STAGETUNE_DATABASE_URL": f"sqlite:///{tmp_path / 'stagetune.db'}",
        "STAGETUNE_DATA_DIR": str(tmp_path / "data"),
        "STAGETUNE_API_TOKEN": TOKEN,
        "STAGETUNE_POLL_S": "0.5",
    }
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        serve = subprocess.Popen(
            [str(STAGETUNE), "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert serve.poll() is None, log_path.read_text()
            try:
                if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "stagetune serve did not come up"
            time.sleep(0.5)

        done = stagetune(
            "submit",
            str(DIGITS_EXAMPLE),
            "--url",
            url,
            "--wait",
            "--interval",
            "1",
            "--timeout",
            "700",
            env={**cli_env(), MARKER_VAR: marker},
            timeout=800,
        )
        assert done.returncode == 0, f"{done.stderr}\n{log_path.read_text()[-5000:]}"
        study_id = int(done.stderr.split("submitted study ", 1)[1].split()[0])
        progress = [line for line in done.stderr.splitlines() if line.startswith("study ")]
        assert any(f"study {study_id}: running, trials" in line for line in progress)
        assert progress[-1].startswith(f"study {study_id} completed; best ")
        # The result was picked on fresh seeds (the default), and the line says so.
        assert "mean of 3 fresh seeds" in progress[-1]
        assert " ± " in progress[-1]
        schedule = Schedule.from_yaml(done.stdout)
        assert schedule.total_epochs == 6
        # serve started a local Ray instance (RAY_AUTH_MODE unset): Ray's notice that token
        # authentication is on by default is left out of its log, the rest of Ray's is not.
        log_text = log_path.read_text()
        assert "Started a local Ray instance" in log_text, log_text[-3000:]
        assert RAY_AUTH_DEFAULT_NOTICE not in log_text
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)  # serve stops its dispatcher, which stops Ray
            try:
                serve.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait(timeout=30)
        deadline = time.monotonic() + 60
        while (left := _marked(marker)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived stagetune serve: {left}"


def test_delete_from_a_study_database_removes_the_study_files_at_once(tmp_path: Path) -> None:
    """``stagetune delete N --database-url URL`` (no service): the study goes from the
    database and its files from this machine's Ray storage path, with what was freed; a study
    without files there keeps its record for a worker; a running study and an unknown id are
    refused with their exit codes."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    data = tmp_path / "data"
    env = cli_env(STAGETUNE_DATA_DIR=str(data))
    spec = {"task": "digits", "budget": {"trials": 1}}
    with StudyStore(url, create=True) as store:
        ran, elsewhere, running = (store.create_study("digits", spec, 1) for _ in range(3))
        for _ in range(3):
            assert store.claim_study("w", 60) is not None
        for study in (ran, elsewhere):
            store.finish_study(study.id, "completed")
    experiment = data / "ray" / experiment_name(ran.id, ran.created_at)
    paths = [experiment, experiment.with_name(f"{experiment.name}.seeds")]
    for path in paths:
        (path / "trial_0" / "checkpoint_000000").mkdir(parents=True)
        (path / "trial_0" / "checkpoint_000000" / "state.pkl").write_bytes(b"s" * 2048)

    done = stagetune("delete", str(ran.id), "--database-url", url, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"study {ran.id} deleted, and its files under {data / 'ray'}: 2 paths, 4.0 KB"
    )
    assert not any(p.exists() for p in paths)

    done = stagetune("delete", str(elsewhere.id), "--database-url", url, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"study {elsewhere.id} deleted; no files of it under ")
    refused = stagetune("delete", str(running.id), "--database-url", url, env=env)
    assert refused.returncode == 4
    assert "is running; cancel it first" in refused.stderr
    unknown = stagetune("delete", "999", "--database-url", url, env=env)
    assert unknown.returncode == 3
    with StudyStore(url) as store:
        assert [x.study_id for x in store.study_leftovers()] == [elsewhere.id]
        assert store.get_study(running.id).status is StudyStatus.RUNNING


def test_storage_shows_each_studys_files_and_clean_frees_what_no_study_claims(
    tmp_path: Path,
) -> None:
    """``stagetune storage``: every experiment on the storage path with its size and whose it
    is; ``--clean`` removes the unclaimed ones (and deleted studies' files waiting for a
    worker) and never a study's of this database; a deleted study that ran and has no files
    on this path keeps its record, and the command says so."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    data = tmp_path / "data"
    storage = data / "ray"
    env = cli_env(STAGETUNE_DATA_DIR=str(data))
    spec = {"task": "digits", "budget": {"trials": 1}}
    with StudyStore(url, create=True) as store:
        elsewhere = store.create_study("digits", spec, 1)  # ran on another storage path
        assert store.claim_study("w", 60) is not None
        store.finish_study(elsewhere.id, "completed")
        store.delete_study(elsewhere.id)
        kept, gone = (store.create_study("digits", spec, 1) for _ in range(2))
        names = {s.id: experiment_name(s.id, s.created_at) for s in (kept, gone)}
        store.delete_study(gone.id)  # its record waits for a worker

    def lay_out(name: str, size: int) -> Path:
        (storage / name / "trial_0").mkdir(parents=True)
        (storage / name / "trial_0" / "state.pkl").write_bytes(b"s" * size)
        return storage / name

    mine = [lay_out(names[kept.id], 4096), lay_out(f"{names[kept.id]}.seeds", 1024)]
    waiting = lay_out(names[gone.id], 2048)
    strangers = [lay_out("study-7-0123abcd", 3072), lay_out("study-8", 512)]  # no such studies
    (storage / "not-a-study").mkdir()

    shown = stagetune("storage", "--database-url", url, env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"Ray storage path {storage}: 4 experiments, 10.5 KB"
    rows = {line.split()[2]: line for line in lines if "study-" in line and "│" in line}
    assert "study (queued)" in rows[names[kept.id]]
    assert "5.0 KB" in rows[names[kept.id]]
    assert "deleted: a worker removes it" in rows[names[gone.id]]
    assert "unclaimed" in rows["study-7-0123abcd"]
    assert "unclaimed" in rows["study-8"]
    assert lines[-1].startswith("2 unclaimed (3.5 KB): no study of this database has them")
    assert all(p.exists() for p in (*mine, waiting, *strangers))  # showing removes nothing

    cleaned = stagetune("storage", "--database-url", url, "--clean", env=env)
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.splitlines()[-1] == "removed 3 paths, 5.5 KB freed"
    assert f"deleted study {elsewhere.id}: no files of study-{elsewhere.id}-" in cleaned.stdout
    assert "for a worker whose storage path holds them" in cleaned.stdout
    assert all(p.is_dir() for p in mine)
    assert not any(p.exists() for p in (waiting, *strangers))
    assert (storage / "not-a-study").is_dir()
    with StudyStore(url) as store:
        assert [x.study_id for x in store.study_leftovers()] == [elsewhere.id]
