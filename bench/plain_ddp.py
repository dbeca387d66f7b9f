"""Plain PyTorch baselines for ``loop_throughput.py``: the task's data and model as a user
would set them up, and plain ``DistributedDataParallel`` over 2 processes.

A module of its own (imported by name from ``bench/``) so that the processes
``torch.multiprocessing`` spawns can import the worker function.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def plain_setup(task_name: str, options: dict[str, Any]) -> tuple[Any, Any, Any]:
    from workers.tasks import get_task

    task = get_task(task_name)
    opts = task.validate_options(options)
    return task, opts, task.load_data(opts, 0)


def _ddp_worker(
    rank: int,
    init_file: str,
    task_name: str,
    options: dict[str, Any],
    batch: int,
    epochs: int,
    result_dir: str,
) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn import functional as F  # noqa: N812
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    # A file rendezvous: a port picked free beforehand can be taken by another process before
    # rank 0 listens on it (EADDRINUSE seen in CI beside Ray and the browser tests).
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    model: Any = None
    try:
        task, opts, data = plain_setup(task_name, options)
        torch.manual_seed(0)
        model = DistributedDataParallel(task.build_model(opts))
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        n = data.num_train
        steps = n // batch
        half = batch // 2
        generator = torch.Generator().manual_seed(1)
        out = []
        for _ in range(epochs + 1):
            perm = torch.randperm(n, generator=generator)
            dist.barrier()
            started = time.perf_counter()
            for k in range(steps):
                idx = perm[k * batch + rank * half : k * batch + (rank + 1) * half]
                loss = F.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
                torch.autograd.backward(loss)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            dist.barrier()
            out.append(steps * batch / (time.perf_counter() - started))
        Path(result_dir, f"rank{rank}.txt").write_text(" ".join(map(str, out[1:])))
    finally:
        # DDP's reducer holds the process group: free it first, so that it is not torn down
        # after the group it uses (a rank once aborted at exit, "terminate called without an
        # active exception", in a CI run beside Ray).
        del model
        dist.destroy_process_group()


def plain_ddp(task: str, options: dict[str, Any], batch: int, epochs: int) -> list[float]:
    """Samples/s per epoch of plain DDP over 2 processes (rank 0's clock). The reference loop
    is torch's own: a rank killed by a signal (not an error in the loop, which raises) is
    measured again once, and said so."""
    from torch.multiprocessing.spawn import ProcessExitedException

    try:
        return _plain_ddp_once(task, options, batch, epochs)
    except ProcessExitedException as exc:
        if exc.signal_name is None:
            raise
        print(f"plain DDP at batch {batch}: {exc}; measuring it again", file=sys.stderr)
        return _plain_ddp_once(task, options, batch, epochs)


def _plain_ddp_once(task: str, options: dict[str, Any], batch: int, epochs: int) -> list[float]:
    from torch.multiprocessing.spawn import spawn

    with tempfile.TemporaryDirectory(prefix="stagetune-ddp-") as tmp:
        init_file = str(Path(tmp, "rendezvous"))
        spawn(_ddp_worker, args=(init_file, task, options, batch, epochs, tmp), nprocs=2)  # type: ignore[no-untyped-call]
        return [float(v) for v in Path(tmp, "rank0.txt").read_text().split()]
