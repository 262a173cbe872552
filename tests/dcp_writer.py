"""A DCP checkpoint written by 2 gloo processes with DTensors sharded by rows and columns."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def expected() -> dict[str, torch.Tensor]:
    return {
        "rows": torch.arange(48, dtype=torch.float32).reshape(8, 6),
        "cols": torch.arange(30, dtype=torch.float64).reshape(3, 10) / 7,
        "bias": torch.linspace(-1, 1, 5).bfloat16(),
        "steps": torch.arange(4),
    }


def _writer(rank: int, directory: str, port: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    full = expected()
    model = {
        "rows": distribute_tensor(full["rows"], mesh, [Shard(0)]),
        "cols": distribute_tensor(full["cols"], mesh, [Shard(1)]),
        "bias": full["bias"],
        "steps": full["steps"],
    }
    dcp.save({"model": model, "epoch": 7, "config": {"lr": 0.1}}, checkpoint_id=directory)
    leave()


def fsdp2_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 15), torch.nn.ReLU(), torch.nn.Linear(15, 3))


def _fsdp2_writer(rank: int, directory: str, port: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    model = fsdp2_model()
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    torch.manual_seed(rank)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optimizer_state}, checkpoint_id=directory)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
    if rank == 0:
        torch.save(full, Path(directory).parent / "reference.pt")
    leave()


def write_fsdp2(directory: Path) -> Path:
    """A training checkpoint of an FSDP2 (fully_shard) model and its optimizer, 2 ranks.

    The full state dict, gathered by torch itself, is saved beside it as ``reference.pt``.
    """
    mp.spawn(_fsdp2_writer, args=(str(directory), free_port()), nprocs=WORLD, join=True)
    return directory


def leave() -> None:
    """End a spawned rank: all ranks meet, the group goes, the process exits 0 at once.

    gloo aborts a rank that tears down alone, and now and then a C++ destructor at interpreter
    exit calls ``std::terminate`` (SIGABRT) after every result is written: the rank exits
    without running them.
    """
    import sys

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write(directory: Path) -> Path:
    mp.spawn(_writer, args=(str(directory), free_port()), nprocs=WORLD, join=True)
    return directory
