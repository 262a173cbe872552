"""torch.distributed.checkpoint directories written by 2 gloo processes."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torchgraft as tg
from tests.helpers import assert_same_state

WORLD = 2


def _expected() -> dict[str, torch.Tensor]:
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
    full = _expected()
    model = {
        "rows": distribute_tensor(full["rows"], mesh, [Shard(0)]),
        "cols": distribute_tensor(full["cols"], mesh, [Shard(1)]),
        "bias": full["bias"],
        "steps": full["steps"],
    }
    dcp.save({"model": model, "epoch": 7, "config": {"lr": 0.1}}, checkpoint_id=directory)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def dcp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("dcp") / "ckpt"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_writer, args=(str(directory), port), nprocs=WORLD, join=True)
    return directory


def test_two_rank_checkpoint_reads_in_one_process(dcp_dir: Path) -> None:
    assert sorted(p.name for p in dcp_dir.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    with tg.open(dcp_dir) as ckpt:
        assert ckpt.format == "dcp"
        assert ckpt.weights_key == "model"
        assert ckpt.meta("rows").shape == (8, 6)
        assert ckpt.meta("cols").dtype == torch.float64
        assert ckpt.extras == {"epoch": 7, "config": {"lr": 0.1}}
        loaded = {k: ckpt.get(k) for k in ckpt.keys()}
    assert_same_state(loaded, _expected(), ordered=False)


def test_missing_data_file_is_reported(dcp_dir: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(dcp_dir, broken)
    (broken / "__1_0.distcp").unlink()
    with pytest.raises(tg.CorruptCheckpointError, match="__1_0.distcp"):
        tg.open(broken)
