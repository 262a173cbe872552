"""``torchgraft inspect`` of safetensors, GGUF, NumPy, torch.save state dicts and DCP: no torch.

One fresh process inspects every file through the command line's entry point and reports
whether torch was imported; its JSON must equal what :func:`torchgraft.inspect` (the full
reader) says. Files with anything the quick reader does not know go to the full reader.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import torchgraft as tg
from tests.helpers import data_parallel_state, save_on
from torchgraft.cli.main import main
from torchgraft.quick_inspect import quick_inspect

GGUF = Path(__file__).parent / "fixtures" / "frameworks" / "gguf"

CHILD = """
import contextlib, io, json, sys
from torchgraft.cli.main import main
results = []
for path in sys.argv[1:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["inspect", path, "--json"])
    results.append({"code": code, "info": json.loads(out.getvalue())})
print(json.dumps({"results": results, "torch": "torch" in sys.modules}))
"""


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 2))


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    state = _model().state_dict()
    written = {
        "model.safetensors": lambda p: save_file({k: v.contiguous() for k, v in state.items()},
                                                 p, metadata={"format": "pt", "step": "7"}),
        "plain.pt": lambda p: torch.save(state, p),
        "dataparallel_cuda1.pth": lambda p: save_on(
            "cuda:1", data_parallel_state(_model()), p),
        "half.bin": lambda p: torch.save({k: v.half() for k, v in state.items()
                                          if v.is_floating_point()}, p),
        "strided.pt": lambda p: torch.save({"t": torch.arange(12.0).reshape(3, 4).t()}, p),
        "array.npy": lambda p: np.save(p, np.ones((2, 3), np.float16)),
        "arrays.npz": lambda p: np.savez(p, w=np.ones(3, np.float32), b=np.zeros(2, np.int64)),
    }
    for name, write in written.items():
        write(tmp_path / name)
    _dcp_save(state, tmp_path / "dcp")  # torch.distributed.checkpoint's own writer
    ggufs = [GGUF / "llama_mixed.gguf", GGUF / "qwen2_f16.gguf", _gguf_arrays(tmp_path)]
    return [*(tmp_path / name for name in written), tmp_path / "dcp", *ggufs]


def _gguf_arrays(folder: Path) -> Path:
    """A GGUF file with array metadata of several types, long and short, by gguf-py's writer."""
    gguf = pytest.importorskip("gguf")
    path = folder / "arrays.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_head_count(2)
    writer.add_embedding_length(8)
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(40)])
    writer.add_array("test.floats", [0.1, -2.5, 3.0])
    writer.add_array("test.ints", [-1, 2, 3])
    writer.add_bool("test.flag", True)
    writer.add_tensor("blk.0.attn_q.weight", np.ones((8, 8), np.float32))
    writer.add_tensor("token_embd.weight", np.ones((4, 8), np.float16))
    writer.add_tensor("extra.table", np.arange(6, dtype=np.int32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _dcp_save(state: object, folder: Path) -> None:
    import warnings

    from torch.distributed.checkpoint import save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save(state, checkpoint_id=str(folder))  # type: ignore[arg-type]


def test_inspect_imports_no_torch_and_says_what_the_full_reader_says(files: list[Path]) -> None:
    result = subprocess.run([sys.executable, "-c", CHILD, *map(str, files)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["torch"] is False
    for path, got in zip(files, data["results"], strict=True):
        assert got["code"] == 0
        assert got["info"] == json.loads(json.dumps(tg.inspect(path).to_dict())), path.name
    assert data["results"][2]["info"]["saved_devices"] == ["cuda:1"]
    assert data["results"][2]["info"]["wrappers"][0]["prefix"] == "module."
    llama = data["results"][-3]["info"]
    assert llama["format"] == "gguf" and llama["by_dtype"]["float32"]["tensors"] == 20
    assert llama["extras"]["__metadata__"]["quantization"]["Q4_K"] == 4
    arrays = data["results"][-1]["info"]["extras"]["__metadata__"]["metadata"]
    assert arrays["tokenizer.ggml.tokens"] == "<40 items>"
    assert arrays["test.ints"] == [-1, 2, 3] and arrays["test.flag"] is True


def test_a_damaged_gguf_goes_to_the_full_reader_and_is_its_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = (GGUF / "llama_mixed.gguf").read_bytes()
    broken = {
        "cut10.gguf": data[:10], "cut200.gguf": data[:200], "cut_data.gguf": data[:-1000],
        "no_heads.gguf": data.replace(b"llama.attention.head_count", b"llama.attention.head_cnt_xx",
                                      1),
        "huge_count.gguf": b"GGUF" + struct.pack("<IQQ", 3, 2**40, 0) + bytes(64),
        "version_9.gguf": b"GGUF" + struct.pack("<IQQ", 9, 0, 0) + bytes(64),
    }
    for name, content in broken.items():
        path = tmp_path / name
        path.write_bytes(content)
        assert quick_inspect(path) is None, name
        with pytest.raises(tg.TorchgraftError):
            tg.inspect(path)
        assert main(["inspect", str(path)]) == 2, name
        assert name in capsys.readouterr().err, name


@pytest.mark.slow
def test_anything_unusual_goes_to_the_full_reader(tmp_path: Path) -> None:
    state = _model().state_dict()
    training = tmp_path / "training.pt"
    torch.save({"epoch": 3, "state_dict": state}, training)
    quantized = tmp_path / "quantized.pt"
    torch.save({"q": torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8)}, quantized)
    lying = tmp_path / "lying.safetensors"
    save_file({"w": torch.ones(4)}, lying)
    data = bytearray(lying.read_bytes())
    lying.write_bytes(bytes(data[:-4]))  # the header promises 16 bytes, 12 are there
    aliased = tmp_path / "tied.safetensors"
    tg.save({"a": torch.ones(2), "b": torch.ones(2)}, aliased)
    legacy = tmp_path / "legacy.pt"
    torch.save(state, legacy, _use_new_zipfile_serialization=False)
    nested = tmp_path / "nested_dcp"
    _dcp_save({"model": dict(state), "step": 3}, nested)
    for path in (training, quantized, lying, legacy, nested):
        assert quick_inspect(path) is None, path.name
    quick = quick_inspect(aliased)
    assert quick is None or quick.to_dict() == tg.inspect(aliased).to_dict()
    assert tg.inspect(training).weights_key == "state_dict"
    result = subprocess.run([sys.executable, "-m", "torchgraft", "inspect", str(lying)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "lying.safetensors" in result.stderr


def _chunk_flood(folder: Path, chunks: int, *, tensors: int = 4, overlap: bool = False) -> Path:
    """A DCP folder of ``tensors`` tensors of ``chunks`` elements, each stored one element a
    chunk (``overlap``: the last chunk of each is its first again). Its ``.metadata`` is
    pickled from torch's own records; the data are zeros."""
    import pickle

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    folder.mkdir()
    entries, storage = {}, {}
    for t in range(tensors):
        fqn = f"t{t}"
        starts = [*range(chunks - 1), 0 if overlap else chunks - 1]
        entries[fqn] = TensorStorageMetadata(
            TensorProperties(dtype=torch.float32), torch.Size([chunks]),
            [ChunkStorageMetadata(offsets=torch.Size([i]), sizes=torch.Size([1])) for i in starts])
        for i in starts:
            storage[MetadataIndex(fqn, torch.Size([i]))] = _StorageInfo(
                "__0_0.distcp", 4 * (t * chunks + i), 4)
    metadata = Metadata(entries, planner_data={f: (f,) for f in entries}, storage_data=storage)
    with (folder / ".metadata").open("wb") as f:
        pickle.dump(metadata, f)
    (folder / "__0_0.distcp").write_bytes(bytes(4 * tensors * chunks))
    return folder


def test_chunk_floods_are_checked_in_linear_work(tmp_path: Path) -> None:
    """4 tensors of thousands of one-element chunks: the quick reader checked every pair of
    chunks (4 tensors of 4,096: over 20 CPU seconds); now as many steps as chunks."""
    from tests.helpers import assert_operations_scale_linearly, operations

    def inspected(chunks: int) -> int:
        folder = _chunk_flood(tmp_path / f"flood{chunks}", chunks)
        return operations(lambda: quick_inspect(folder))

    assert_operations_scale_linearly(inspected, 512)
    quick = quick_inspect(tmp_path / "flood2048")  # the control: read, as the full reader does
    assert quick is not None and quick.to_dict() == tg.inspect(tmp_path / "flood2048").to_dict()
    overlapping = _chunk_flood(tmp_path / "overlap", 2048, overlap=True)
    assert quick_inspect(overlapping) is None  # the full reader's error, not a summary
    with pytest.raises(tg.CorruptCheckpointError, match="overlap"):
        tg.inspect(overlapping)
