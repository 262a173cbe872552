"""torch.distributed.checkpoint directories written by 2 gloo processes."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import torchgraft as tg
from tests.dcp_writer import expected
from tests.helpers import assert_same_state, assert_scales_linearly, cpu_seconds


@pytest.mark.slow
def test_two_rank_checkpoint_reads_in_one_process(two_rank_dcp: Path) -> None:
    assert sorted(p.name for p in two_rank_dcp.glob("*.distcp")) == ["__0_0.distcp",
                                                                     "__1_0.distcp"]
    with tg.open(two_rank_dcp) as ckpt:
        assert ckpt.format == "dcp"
        assert ckpt.weights_key == "model"
        assert ckpt.meta("rows").shape == (8, 6)
        assert ckpt.meta("cols").dtype == torch.float64
        assert ckpt.extras == {"epoch": 7, "config": {"lr": 0.1}}
        loaded = {k: ckpt.get(k) for k in ckpt.keys()}
    assert_same_state(loaded, expected(), ordered=False)


def test_missing_data_file_is_reported(two_rank_dcp: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(two_rank_dcp, broken)
    (broken / "__1_0.distcp").unlink()
    with pytest.raises(tg.CorruptCheckpointError, match="__1_0.distcp"):
        tg.open(broken)


@pytest.mark.slow
def test_fsdp2_training_checkpoint_loads_and_grafts(tmp_path: Path) -> None:
    from tests.dcp_writer import fsdp2_model, write_fsdp2

    path = write_fsdp2(tmp_path / "ckpt")
    reference = torch.load(tmp_path / "reference.pt", weights_only=True)
    with tg.open(path) as ckpt:
        assert ckpt.weights_key == "model"
        assert_same_state({k: ckpt.get(k) for k in ckpt.keys()}, reference)
    model = fsdp2_model()
    torch.nn.init.zeros_(model[0].weight)
    assert tg.graft(path, model, strict=True).ok
    assert_same_state(model.state_dict(), reference)


def _row_chunks(path: Path, rows: int, *, overlap: bool = False,
                stored: bool = True) -> torch.Tensor:
    """A DCP directory of one ``[rows, 2]`` tensor stored one chunk per row, written by torch's
    ``FileSystemWriter`` in one file; ``overlap``: rows 0-1 in one chunk, row 1 again in the
    next, the last row in none (as many elements as the tensor, not each once). Not
    ``stored``: the writer writes the ``.metadata`` of chunks whose bytes are zeros (opens,
    never read)."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter, _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )
    from torch.distributed.checkpoint.storage import WriteResult

    tensor = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2)
    spans = [(0, 2), *((r, 1) for r in range(1, rows - 1))] if overlap else \
        [(r, 1) for r in range(rows)]
    properties = TensorProperties(dtype=torch.float32)
    chunks = [ChunkStorageMetadata(offsets=torch.Size((r, 0)), sizes=torch.Size((n, 2)))
              for r, n in spans]
    items = [WriteItem(MetadataIndex("w", chunk.offsets), WriteItemType.SHARD,
                       tensor_data=TensorWriteData(chunk, properties, tensor.shape))
             for chunk in chunks]

    class Planner:
        def resolve_data(self, item: WriteItem) -> torch.Tensor:
            return tensor.narrow(0, item.index.offset[0], item.tensor_data.chunk.sizes[0])

    writer = FileSystemWriter(str(path))
    writer.set_up_storage_writer(True)
    if stored:
        (plan,) = writer.prepare_global_plan([writer.prepare_local_plan(SavePlan(items))])
        results = [writer.write_data(plan, Planner()).wait()]  # type: ignore[arg-type]
    else:
        path.mkdir()
        (path / "__0_0.distcp").write_bytes(bytes(8 * rows))
        results = [[WriteResult(item.index, 8, _StorageInfo("__0_0.distcp", 8 * k, 8))
                    for k, item in enumerate(items)]]
    writer.finish(Metadata({"w": TensorStorageMetadata(properties, tensor.shape, chunks)}),
                  results)
    return tensor


def test_thousands_of_chunks_are_checked_in_linear_time(tmp_path: Path) -> None:
    def seconds(rows: int) -> float:
        _row_chunks(tmp_path / f"rows{rows}", rows, stored=False)
        return cpu_seconds(lambda: tg.open(tmp_path / f"rows{rows}").close(), repeat=2)

    assert_scales_linearly(seconds, 1000)  # the pairwise check was skipped past 4,096
    with tg.open(tmp_path / "rows4000") as ckpt:
        assert ckpt.meta("w").shape == (4000, 2)


def test_a_checkpoint_of_many_chunks_opens_and_reads(tmp_path: Path) -> None:
    # Three records of unknown classes per chunk in the .metadata: the unpickler's budget
    # (one record per 256 bytes then) refused a checkpoint of more than about 7,000 chunks.
    _row_chunks(tmp_path / "many", 12_000, stored=False)
    with tg.open(tmp_path / "many") as ckpt:
        assert ckpt.meta("w").shape == (12_000, 2)
    expected = _row_chunks(tmp_path / "read", 300)
    assert torch.equal(tg.load(tmp_path / "read")["w"], expected)


@pytest.mark.parametrize("rows", [8, 4100])  # the overlap went unchecked past 4,096 chunks
def test_overlapping_chunks_are_refused_however_many(tmp_path: Path, rows: int) -> None:
    _row_chunks(tmp_path / "overlap", rows, overlap=True)
    with pytest.raises(tg.CorruptCheckpointError, match=f"cover {2 * rows} of its {2 * rows} "
                                                        "elements and overlap"):
        tg.open(tmp_path / "overlap")



def _outcome(work: Callable[[], object], named: Path) -> str | None:
    """``None`` when ``work`` succeeds or raises a library error naming ``named``; else what
    went wrong (a raw exception, or an error naming another file or a descriptor)."""
    try:
        work()
    except tg.TorchgraftError as exc:
        if str(named) not in str(exc) or "/proc/self/fd" in str(exc):
            return f"does not name {named.name}: {exc}"
    except Exception as exc:  # what the test looks for
        return f"raw {type(exc).__name__}: {exc}"
    return None


def test_every_integer_of_a_chunks_pickle_forged_loads_or_is_refused_naming_the_file(
        tmp_path: Path) -> None:
    """Each integer of each chunk archive's ``data.pkl`` (a storage's size, a tensor's offset,
    shape and strides: what the chunk's bytes are mapped by), changed with the zip's CRCs
    recomputed, through load, graft and convert (a raw AttributeError from the mapping of a
    chunk's range before)."""
    from torch.distributed.checkpoint import save

    from tests.io.fields import fields, with_crcs, with_value
    from tests.test_fuzz import _Net, _state

    seed = tmp_path / "seed"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save(_state(), checkpoint_id=str(seed))
    work = tmp_path / "work"
    shutil.copytree(seed, work)
    blob = work / "__0_0.distcp"
    data = blob.read_bytes()
    integers = [f for f in fields(data) if f.what.startswith("pickle BININT")]
    assert len(integers) >= 16
    assert torch.equal(tg.load(work)["fc.weight"], _state()["fc.weight"])  # the control
    failures = []
    for field in integers:
        value = int.from_bytes(data[field.offset:field.offset + field.width], "little")
        for changed in {value - 1, value + 1, 0, 1, 255 if field.width == 1 else 1 << 20}:
            blob.write_bytes(with_crcs(with_value(data, field, changed)))
            for what, work_on in (
                    ("load", lambda: tg.load(work)),
                    ("graft", lambda: tg.graft(work, _Net())),
                    ("convert", lambda: tg.convert(work, tmp_path / "out.safetensors",
                                                   overwrite=True))):
                problem = _outcome(work_on, blob)
                if problem is not None:
                    failures.append(f"{what}, {field.what} at {field.offset} = {changed}: "
                                    f"{problem}")
    assert not failures, "\n".join(failures[:10])
