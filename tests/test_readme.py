"""The README's examples run: its schedule YAML loads and its two commands exist."""

from __future__ import annotations

import re
from pathlib import Path

from tuner.schedule import Schedule

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_starts_with_the_two_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands[:2] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^demo:", makefile, re.M)
    assert re.search(r"^test:", makefile, re.M)


def test_readme_schedule_example_is_the_shipped_example_and_loads() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", README, re.S)
    schedules = [b for b in blocks if b.lstrip().startswith("#") and "stages:" in b]
    assert schedules, "README has no complete schedule example"
    example = (ROOT / "examples" / "schedule.yaml").read_text(encoding="utf-8")
    assert schedules[0] == example
    schedule = Schedule.from_yaml(schedules[0])
    assert schedule.total_epochs == schedule.stages[-1].end_epoch
    assert len(schedule.stages) >= 2
