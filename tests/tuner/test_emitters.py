"""Megatron-LM and DeepSpeed emitters: artefacts the frameworks accept, and honest limitations."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from tuner.emitters import MEGATRON_ARRAY, emit_deepspeed, emit_megatron
from tuner.errors import ValidationError
from tuner.retarget import RetargetError
from tuner.schedule import Schedule, Stage


def ramp_like() -> Schedule:
    """128 -> 256 -> 384 over equal sample spans, then 512: exactly a Megatron ramp."""
    return Schedule(
        stages=(Stage(0, 2, 128), Stage(2, 4, 256), Stage(4, 6, 384), Stage(6, 10, 512)),
        base_lr=0.1,
        base_batch_size=128,
        scaling_rule="none",
    )


def step_schedule() -> Schedule:
    return Schedule(
        stages=(Stage(0, 3, 64), Stage(3, 8, 256), Stage(8, 12, 1024)),
        base_lr=0.1,
        base_batch_size=64,
    )


def _megatron_batches(args: tuple[str, ...], total: int) -> list[int]:
    """Replays Megatron's batch rule from the emitted arguments (independently of the code)."""
    values = {args[i]: args[i + 1 : i + 4] for i in range(len(args)) if args[i].startswith("--")}
    global_batch = int(values["--global-batch-size"][0])
    ramp = values.get("--rampup-batch-size")
    out, consumed = [], 0
    while consumed < total:
        if ramp is None or consumed > int(ramp[2]):
            batch = global_batch
        else:
            start, inc, samples = (int(v) for v in ramp[:3])
            per = samples / ((global_batch - start) // inc)
            batch = start + int(consumed / per) * inc
        out.append(batch)
        consumed += batch
    return out


def test_megatron_ramp_for_a_ramp_like_schedule_is_exact(tmp_path: Path) -> None:
    schedule = ramp_like()
    result = emit_megatron(schedule, 3072, data_parallel_size=2, micro_batch=64)
    assert result.limitations == ()
    args = result.artefact.args
    assert args[args.index("--rampup-batch-size") + 1 : args.index("--rampup-batch-size") + 4] == (
        "128",
        "128",
        "18432",
    )
    expected = [s.batch_size for s in schedule.iter_steps(3072)]
    assert _megatron_batches(args, result.artefact.train_samples) == expected
    assert result.artefact.max_batch_deviation == 0.0
    assert "exact" in result.text
    # The file is bash: sourced, it defines the arguments as an array, exactly these.
    script = tmp_path / "args.sh"
    script.write_text(result.text, encoding="utf-8")
    shown = subprocess.run(
        [
            "bash",
            "-c",
            f'source {shlex.quote(str(script))} && printf "%s\\n" "${{{MEGATRON_ARRAY}[@]}}"',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert shown == list(args)
    assert subprocess.run(["bash", str(script)], check=False).returncode == 0


def test_megatron_step_schedule_warns_with_the_deviation() -> None:
    result = emit_megatron(step_schedule(), 4096, data_parallel_size=4)
    art = result.artefact
    batch_notes = [t for t in result.limitations if "--rampup-batch-size" in t]
    assert len(batch_notes) == 1
    # 64@0-3 -> 256@3-8 -> 1024@8-12 cannot be a linear ramp: some step is far off.
    assert art.max_batch_deviation >= 0.5
    assert 0 < art.weighted_batch_deviation < art.max_batch_deviation
    assert f"{100 * art.max_batch_deviation:.3g}%" in batch_notes[0]
    assert f"{100 * art.weighted_batch_deviation:.3g}%" in batch_notes[0]
    # The replayed Megatron batches really do differ from the schedule's at the reported max.
    steps = list(step_schedule().iter_steps(4096))
    starts, consumed = [], 0
    for s in steps:
        starts.append(consumed)
        consumed += s.batch_size
    replay = _megatron_batches(art.args, art.train_samples)
    worst, consumed = 0.0, 0
    for b in replay:
        k = max(i for i, c in enumerate(starts) if c <= consumed)
        worst = max(worst, abs(b - steps[k].batch_size) / steps[k].batch_size)
        consumed += b
    assert worst == pytest.approx(art.max_batch_deviation)
    # The LR changes per stage (linear scaling) are beyond Megatron's one warm-up + decay.
    assert any("per-stage LR multipliers" in t for t in result.limitations)
    assert art.global_batch_size == 1024
    assert art.micro_batch_size * 4 == 64


def test_megatron_single_cosine_stage_lr_is_exact() -> None:
    schedule = Schedule.constant(256, 10, base_lr=0.4, decay="cosine", decay_final_factor=0.01)
    result = emit_megatron(schedule, 2560, data_parallel_size=8, micro_batch=16)
    assert result.limitations == ()
    assert result.artefact.lr.decay_style == "cosine"
    assert "--rampup-batch-size" not in result.artefact.args


def test_megatron_says_what_it_cannot_do() -> None:
    schedule = Schedule(
        stages=(Stage(0, 2, 64),),
        base_lr=0.1,
        base_batch_size=64,
        optimizer="lars",
        label_smoothing=0.1,
    )
    result = emit_megatron(schedule, 1000, data_parallel_size=2)
    text = " ".join(result.limitations)
    assert "no LARS optimizer" in text
    assert "label_smoothing=0.1" in text
    with pytest.raises(ValidationError, match="multiples of micro-batch"):
        emit_megatron(step_schedule(), 4096, data_parallel_size=3)


def test_deepspeed_config_per_stage_batch_arithmetic_holds() -> None:
    schedule = Schedule(
        stages=(
            Stage(0, 3, 96, warmup_epochs=1.0),
            Stage(3, 8, 384, lr_multiplier=0.5, warmup_epochs=1.0, decay="linear"),
            Stage(8, 12, 1536, lr_multiplier=0.25, decay="cosine", decay_final_factor=0.1),
        ),
        base_lr=0.1,
        base_batch_size=96,
    )
    n = 6144
    result = emit_deepspeed(schedule, n, world_size=8, micro_batch=20)
    plan = result.artefact
    assert [(s.start_epoch, s.end_epoch) for s in plan.stages] == [(0, 3), (3, 8), (8, 12)]
    for s, st in zip(plan.stages, schedule.stages, strict=True):
        c = s.config
        assert c["train_batch_size"] == st.batch_size
        assert (
            c["train_micro_batch_size_per_gpu"] * c["gradient_accumulation_steps"] * 8
            == c["train_batch_size"]
        )
        assert c["train_micro_batch_size_per_gpu"] <= 20
        assert s.optimizer_steps == schedule.stage_steps(n)[s.stage_index]
        assert c["scheduler"]["params"]["warmup_type"] == "linear"
    assert [s.config["scheduler"]["type"] for s in plan.stages] == [
        "WarmupLR",
        "WarmupDecayLR",
        "WarmupCosineLR",
    ]
    # Stage 1 warms up over a whole epoch (64 steps) from base_lr: WarmupLR reproduces it.
    assert plan.stages[0].max_lr_deviation < 1e-9
    assert plan.stages[0].config["scheduler"]["params"]["warmup_num_steps"] == 64
    text = " ".join(result.limitations)
    assert "restarting from its checkpoint with the next stage's config" in text
    assert "stage 1" not in text  # exact stages are not reported
    document = json.loads(result.text)
    assert [s["config"] for s in document["stages"]] == [s.config for s in plan.stages]
    assert document["limitations"] == list(result.limitations)


def test_deepspeed_step_decay_is_reported_and_unplaceable_stages_named() -> None:
    schedule = Schedule(
        stages=(Stage(0, 4, 64, decay="step", step_every_epochs=2.0, step_gamma=0.1),),
        base_lr=0.1,
        base_batch_size=64,
    )
    result = emit_deepspeed(schedule, 640, world_size=2)
    assert any("no step-decay scheduler" in t for t in result.limitations)
    assert result.artefact.stages[0].max_lr_deviation == pytest.approx(
        9.0
    )  # 0.1 held where 0.01 is due
    with pytest.raises(RetargetError) as info:
        emit_deepspeed(step_schedule(), 4096, world_size=3)
    assert "stage 1 (epochs 0-3)" in str(info.value)
    assert "stage 2 (epochs 3-8)" in str(info.value)
