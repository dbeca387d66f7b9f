"""End to end: ``stagetune serve`` as a real process (uvicorn + embedded dispatcher) on a free
port with a temporary SQLite database. A small ``digits`` study is submitted over HTTP,
polled to completion, and its best schedule downloaded and loaded with ``Schedule.from_yaml``;
then SIGTERM stops the server and its dispatcher cleanly."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.environ import environ_without
from tuner.schedule import Schedule

REPO = Path(__file__).resolve().parents[1]
TOKEN = "e2e-token"

SPEC = """\
task: digits
name: e2e
baselines: false
schedule: {total_epochs: 2}
space:
  stages: {min: 1, max: 2}
  batch_size: {min: 32, max: 128}
budget: {trials: 2, grace_period_epochs: 1}
resources: {workers: 1, cpus_per_worker: 1}
"""

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    base: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]


@pytest.fixture
def server(tmp_path: Path, ray_session: None) -> Iterator[Server]:
    import ray

    port = free_port()
    env = environ_without("STAGETUNE_")
    env.update(
        PYTHONPATH=str(REPO),
        STAGETUNE_DATA_DIR=str(tmp_path / "data"),  # the embedded SQLite default lives here
        STAGETUNE_API_TOKEN=TOKEN,
        STAGETUNE_MAX_REQUEST_BYTES="20000",
        STAGETUNE_POLL_S="0.5",
        STAGETUNE_HEARTBEAT_S="1",
        # The dispatcher joins the test session's Ray instance instead of starting another.
        RAY_ADDRESS=ray.get_runtime_context().gcs_address,
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from workers.cli import main; main()",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    srv = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, srv.output()
            try:
                if httpx.get(f"{srv.base}/api/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, srv.output()
            time.sleep(0.3)
        yield srv
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_submit_run_and_download_the_best_schedule(server: Server, tmp_path: Path) -> None:
    api = f"{server.base}/api/v1"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    yaml_type = {"Content-Type": "application/yaml"}
    with httpx.Client(timeout=30) as http:
        # Writes need the token; reads are open.
        assert http.post(f"{api}/studies", content=SPEC, headers=yaml_type).status_code == 401
        r = http.post(f"{api}/studies", content=SPEC, headers={**yaml_type, **auth})
        assert r.status_code == 201, r.text
        study_id = r.json()["id"]
        assert r.headers["location"] == f"{api}/studies/{study_id}"

        # A streamed (chunked) body over the limit is refused by the real server too.
        def chunks() -> Iterator[bytes]:
            for _ in range(30):
                yield b"#" * 1000 + b"\n"

        r = http.post(f"{api}/studies", content=chunks(), headers={**yaml_type, **auth})
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "request_too_large"

        deadline = time.monotonic() + 420
        while True:
            study = http.get(f"{api}/studies/{study_id}").json()
            if study["status"] in {"completed", "failed", "cancelled"}:
                break
            assert time.monotonic() < deadline, (study, server.output())
            time.sleep(1)
        assert study["status"] == "completed", (study, server.output())
        assert study["progress"]["trials_done"] == 2
        assert study["best"] is not None
        assert study["attempts"] == 1

        trials = http.get(f"{api}/studies/{study_id}/trials").json()
        assert trials["total"] == 2
        metrics = http.get(f"{api}/studies/{study_id}/metrics").json()
        assert all(t["epochs"] for t in metrics["trials"])

        r = http.get(f"{api}/studies/{study_id}/schedule.yaml")
        assert r.status_code == 200, r.text
        assert r.headers["content-disposition"] == (
            f'attachment; filename="study-{study_id}-best.yaml"'
        )
    path = tmp_path / "best.yaml"
    path.write_bytes(r.content)
    schedule = Schedule.from_yaml(path.read_text(encoding="utf-8"))
    assert schedule.summary() == study["best"]["schedule_summary"]
    assert schedule.total_epochs == 2
    assert schedule.provenance is not None
    assert schedule.provenance["study_id"] == study_id

    # Deleting the study removes its Ray Tune experiment (and the files beside it) from the
    # storage path too: the embedded dispatcher does it at its next look for work.
    storage = tmp_path / "data" / "ray"
    left = sorted(storage.glob(f"study-{study_id}-*"))
    assert left, sorted(storage.iterdir())
    with httpx.Client(timeout=30) as http:
        assert http.delete(f"{api}/studies/{study_id}", headers=auth).status_code == 204
        assert http.get(f"{api}/studies/{study_id}").status_code == 404
    deadline = time.monotonic() + 60
    while any(p.exists() for p in left):
        assert time.monotonic() < deadline, (left, server.output())
        time.sleep(0.5)

    # SIGTERM: the server and its embedded dispatcher exit cleanly.
    dispatchers = children(server.process.pid)
    assert dispatchers, server.output()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=90) == 0, server.output()
    for pid in dispatchers:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid), server.output()


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
