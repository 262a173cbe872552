"""Run by ``torch.distributed.run`` from test_sharded_memory.py: bytes each rank materialises.

Usage: ``python -m torch.distributed.run --nproc_per_node 2 sharded_memory_ranks.py FOLDER``.
Each rank grafts every file of FOLDER into an FSDP2 model built on meta, counting the bytes it
brings into memory from the file: read by positioned reads (``FileSource.read_into``), and
viewed through the file's mapping (``FileSource._slice``: each such page becomes part of the
rank's memory once touched). Each rank writes ``rank{N}.json``: file name to bytes, and whether
the graft was ok and its values exact.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn

import torchgraft as tg
from torchgraft.io.source import FileSource

LAYERS, WIDTH = 8, 128


def build(meta: bool) -> nn.Module:
    with torch.device("meta" if meta else "cpu"):
        return nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))


def reference() -> nn.Module:
    torch.manual_seed(0)
    return build(meta=False)


@contextmanager
def counted() -> Iterator[list[int]]:
    """Count the bytes read into memory, and viewed through the file's mapping."""
    total = [0]
    read_into, mapped = FileSource.read_into, FileSource._slice

    def counted_read(self: FileSource, offset: int, out: torch.Tensor, **kw: Any) -> None:
        total[0] += out.numel() * out.element_size()
        read_into(self, offset, out, **kw)

    def counted_slice(self: FileSource, offset: int, nbytes: int) -> torch.UntypedStorage:
        total[0] += nbytes
        return mapped(self, offset, nbytes)

    with mock.patch.object(FileSource, "read_into", counted_read), \
            mock.patch.object(FileSource, "_slice", counted_slice):
        yield total


def graft(path: Path) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = build(meta=True)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with counted() as total:
        report = tg.graft(path, model)
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    expected = reference().state_dict()
    exact = all(torch.equal(full[k], v) for k, v in expected.items())
    return {"bytes": total[0], "ok": report.ok, "exact": exact}


def main() -> None:
    folder = Path(sys.argv[1])
    dist.init_process_group("gloo")
    results: dict[str, Any] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix in (".pt", ".safetensors"):
            if path.stem.endswith("mapped"):  # the broken twin: transposed tensors mapped
                with mock.patch("torchgraft.io.torch_storage.storage_order",
                                lambda *args: None):
                    results[path.name] = graft(path)
            else:
                results[path.name] = graft(path)
    (folder / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
