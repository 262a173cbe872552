"""One checkpoint file loaded into DTensors on 2 gloo processes, each rank reading its part."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import save_file

from tests.dcp_writer import WORLD, free_port, leave

FULL = {"w": torch.arange(48.0).reshape(8, 6), "v": torch.arange(30.0).reshape(3, 10),
        "b": torch.arange(5.0)}


def _load(rank: int, path: str, port: int, results: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from torchgraft.distributed import CheckpointReader

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    state = {"w": distribute_tensor(torch.zeros(8, 6), mesh, [Shard(0)]),
             "v": distribute_tensor(torch.zeros(3, 10), mesh, [Shard(1)]),
             "b": torch.zeros(5)}
    dcp.load(state, storage_reader=CheckpointReader(path))
    torch.save({"w": state["w"].to_local(), "v": state["v"].to_local(), "b": state["b"]},
               f"{results}/rank{rank}.pt")
    leave()


@pytest.mark.slow
def test_single_file_into_two_ranks(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file(FULL, path)
    mp.spawn(_load, args=(str(path), free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        local = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert torch.equal(local["w"], FULL["w"][rank * 4:(rank + 1) * 4])
        assert torch.equal(local["v"], FULL["v"][:, rank * 5:(rank + 1) * 5])
        assert torch.equal(local["b"], FULL["b"])
