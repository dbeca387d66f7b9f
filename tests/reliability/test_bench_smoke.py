"""``bench/api_load.py --smoke``: the load benchmark runs end to end in CI (small data, short
phases): every read endpoint answers under load while a writer process writes, no request
fails, and the output ends with the summary line and writes its JSON and Markdown reports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.helpers import REPO, clean_env

SUMMARY = re.compile(r"^api_load rps=[\d.]+ p50_ms=[\d.]+ p99_ms=[\d.]+$")


@pytest.mark.slow
@pytest.mark.ray_free
def test_api_load_smoke(tmp_path: Path) -> None:
    out = tmp_path / "api_load"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "api_load.py"), "--smoke", "--out", str(out)],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert SUMMARY.match(lines[-1]), lines[-1]
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["failures"] == 0
    assert result["writer"]["errors"] == 0, result["writer"]
    assert result["writer"]["writes"] > 0
    names = [e["name"] for e in result["endpoints"]]
    assert names == [
        "study_list",
        "trials_page",
        "trial_detail",
        "trial_metrics",
        "study_detail",
        "study_metrics",
    ]
    # A phase lasts its duration and at least min_requests requests, so a loaded machine (CI
    # runs this at idle priority beside training) slows it down but never empties it.
    assert result["config"]["min_requests"] == 20
    for endpoint in result["endpoints"]:
        assert endpoint["requests"] >= 20, endpoint
        assert endpoint["failures"] == 0, endpoint
    assert result["machine"]["cpus"] >= 1
    assert "| trials_page |" in out.with_suffix(".md").read_text()
