"""Reading plain copies in runs of neighbouring byte ranges, dealt into batches for threads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from torchgraft.errors import CorruptCheckpointError
from torchgraft.io.reads import Read, batches, plan_read, read_all, runs
from torchgraft.meta import TensorMeta, TensorRef


def file_reads(path: Path) -> tuple[dict[str, torch.Tensor], list[Read]]:
    ckpt = tg.open(path)
    refs = ckpt.tensor_refs()
    outs = {name: torch.empty(ref.meta.shape, dtype=ref.meta.dtype) for name, ref in refs.items()}
    return outs, [plan_read(name, ref, outs[name]) for name, ref in refs.items()]


def test_neighbouring_tensors_are_read_in_one_run_into_their_targets(tmp_path: Path) -> None:
    tensors = {f"t{i}": torch.arange(i * 10, i * 10 + 6, dtype=torch.float32).reshape(2, 3)
               for i in range(50)} | {"empty": torch.empty(0), "half": torch.ones(3).half()}
    save_file(tensors, tmp_path / "a.safetensors")
    outs, reads = file_reads(tmp_path / "a.safetensors")
    assert [len(run) for run in runs(reads)] == [len(tensors)]  # one preadv for all of them
    read_all(reads, threads=2)
    for name, tensor in tensors.items():
        assert torch.equal(outs[name], tensor), name


def test_runs_are_dealt_into_batches_of_about_equal_bytes(tmp_path: Path) -> None:
    path = tmp_path / "b.safetensors"
    save_file({f"t{i}": torch.full((1024,), float(i)) for i in range(8)}, path)
    outs, reads = file_reads(path)
    split = [[r] for r in reads]
    dealt = batches(split, 2)
    assert [sum(len(g) for g in b) for b in dealt] == [4, 4]
    counts: list[int] = []
    read_all(reads, threads=2, done=counts.append)
    assert sum(counts) == 8 and all(torch.equal(outs[f"t{i}"], torch.full((1024,), float(i)))
                                    for i in range(8))


def test_other_dtypes_and_in_memory_tensors_are_read_one_by_one() -> None:
    value = torch.arange(6.0)
    ref = TensorRef(TensorMeta.of((6,), torch.float32), lambda: value)
    out = torch.empty(6, dtype=torch.float64)
    read = plan_read("x", ref, out)
    assert read.path is None and runs([read]) == [[read]]
    read_all([read], threads=2)
    assert torch.equal(out, value.double())


def test_a_file_that_shrank_is_an_error_naming_the_tensor(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    save_file({"a": torch.ones(1000), "b": torch.ones(1000)}, path)
    _, reads = file_reads(path)
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 100)
    with pytest.raises(CorruptCheckpointError, match="'a' or a tensor after it ends early"):
        read_all(reads, threads=1)
