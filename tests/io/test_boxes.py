"""Reading a block of a stored tensor (a rank's shard): its values, and only its bytes."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from torchgraft.io.boxes import box_runs

FULL = torch.arange(6 * 10 * 4, dtype=torch.float32).reshape(6, 10, 4)
BLOCKS = [((0, 0, 0), (6, 10, 4)), ((2, 0, 0), (3, 10, 4)), ((0, 5, 0), (6, 5, 4)),
          ((1, 2, 1), (4, 3, 2)), ((5, 9, 3), (1, 1, 1)), ((3, 0, 0), (0, 10, 4))]


def _cut(tensor: torch.Tensor, start: tuple[int, ...], size: tuple[int, ...]) -> torch.Tensor:
    for dim, (first, length) in enumerate(zip(start, size, strict=True)):
        tensor = tensor.narrow(dim, first, length)
    return tensor


def test_runs_of_rows_columns_and_scalars() -> None:
    assert list(box_runs((8, 6), 4, (2, 0), (3, 6))) == [(48, 72)]  # rows: one run
    assert list(box_runs((3, 10), 2, (0, 5), (3, 5))) == [(10, 10), (30, 10), (50, 10)]
    assert list(box_runs((), 8, (), ())) == [(0, 8)]
    assert list(box_runs((4, 4), 4, (1, 0), (0, 4))) == []


def _counting() -> tuple[list[int], mock._patch[object]]:
    counts: list[int] = []
    real = os.preadv

    def preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        counts.append(sum(len(b) for b in buffers))
        return real(fd, buffers, offset)

    return counts, mock.patch("os.preadv", preadv)


@pytest.mark.parametrize("suffix", ["safetensors", "pt"])
@pytest.mark.parametrize(("start", "size"), BLOCKS)
def test_a_block_reads_its_bytes_only(tmp_path: Path, suffix: str, start: tuple[int, ...],
                                      size: tuple[int, ...]) -> None:
    path = tmp_path / f"w.{suffix}"
    if suffix == "pt":
        torch.save({"w": FULL}, path)
    else:
        save_file({"w": FULL}, path)
    ref = tg.open(path).tensor_refs()["w"]
    out = torch.full(size, -1.0)
    counts, patch = _counting()
    with patch:
        ref.read_box(start, out)
    assert torch.equal(out, _cut(FULL, start, size))
    assert sum(counts) == out.numel() * 4


def test_a_block_cast_on_the_way(tmp_path: Path) -> None:
    save_file({"w": FULL}, tmp_path / "w.safetensors")
    out = torch.empty(2, 10, 4, dtype=torch.float64)
    tg.open(tmp_path / "w.safetensors").tensor_refs()["w"].read_box((4, 0, 0), out)
    assert torch.equal(out, FULL[4:].double())


def test_a_block_outside_the_tensor_is_refused(tmp_path: Path) -> None:
    save_file({"w": FULL}, tmp_path / "w.safetensors")
    ref = tg.open(tmp_path / "w.safetensors").tensor_refs()["w"]
    with pytest.raises(ValueError, match="does not lie inside"):
        ref.read_box((5, 0, 0), torch.empty(2, 10, 4))


def test_a_block_of_a_compressed_storage_is_cut_from_the_whole(tmp_path: Path) -> None:
    import zipfile

    plain = tmp_path / "plain.pt"
    torch.save({"w": FULL}, plain)
    squeezed = tmp_path / "squeezed.pt"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(squeezed, "w",
                                                        zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            dst.writestr(item.filename, src.read(item))
    out = torch.empty(2, 10, 4)
    tg.open(squeezed).tensor_refs()["w"].read_box((1, 0, 0), out)
    assert torch.equal(out, FULL[1:3])


@pytest.mark.slow
def test_a_block_of_dcp_reads_the_chunks_it_spans(two_rank_dcp: Path) -> None:
    """Written by 2 ranks (rows and columns halved), read in blocks of another sharding:
    only the chunks the block overlaps are opened, and only the overlap's bytes read."""
    from tests.dcp_writer import expected
    from torchgraft.io import dcp

    refs = tg.open(two_rank_dcp).tensor_refs()
    full = expected()
    for name, start, size, chunks in [("rows", (3, 1), (3, 4), 2), ("rows", (5, 0), (3, 6), 1),
                                      ("cols", (1, 3), (2, 5), 2), ("cols", (0, 5), (3, 5), 1)]:
        out = torch.empty(size, dtype=full[name].dtype)
        counts, patch = _counting()
        with patch, mock.patch.object(dcp, "read_archive", wraps=dcp.read_archive) as opened:
            refs[name].read_box(start, out)
        assert torch.equal(out, _cut(full[name], start, size))
        assert opened.call_count == chunks
        assert sum(counts) == out.numel() * out.element_size()


def test_a_window_refuses_bytes_outside_it(tmp_path: Path) -> None:
    from torchgraft.io.source import FileSource
    from torchgraft.io.window import Window

    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(100)))
    window = Window(FileSource(path), 10, 20)
    assert window.read(5, 3) == bytes([15, 16, 17])
    with pytest.raises(tg.CorruptCheckpointError, match="needs bytes 15..25"):
        window.read(15, 10)
    with pytest.raises(tg.CorruptCheckpointError):
        window.read_into(18, torch.empty(4, dtype=torch.uint8))
    with pytest.raises(tg.CorruptCheckpointError):
        Window(FileSource(path), 90, 20)
