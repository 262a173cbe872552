"""DeepSpeed folders whose records lie: refused before anything is read, each beside its control.

The folders are deepspeed's own (tests/fixtures/deepspeed, ``engine.save_checkpoint``) with one
record changed: the files are loaded and saved again by torch, with stand-ins for the three
deepspeed classes they name (deepspeed itself is not installed), so every other record stays
as deepspeed wrote it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

import torchgraft as tg
from torchgraft.errors import CorruptCheckpointError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "deepspeed"

#: Stand-ins for the deepspeed classes its checkpoints pickle, as modules of a package.
_STAND_INS = {
    "deepspeed/__init__.py": "",
    "deepspeed/runtime/__init__.py": "",
    "deepspeed/runtime/zero/__init__.py": "",
    "deepspeed/runtime/zero/config.py": (
        "import enum\n\nclass ZeroStageEnum(int, enum.Enum):\n    disabled = 0\n"
        "    optimizer_states = 1\n    gradients = 2\n    weights = 3\n"),
    "deepspeed/runtime/fp16/__init__.py": "",
    "deepspeed/runtime/fp16/loss_scaler.py": "class LossScaler:\n    pass\n",
    "deepspeed/utils/__init__.py": "",
    "deepspeed/utils/tensor_fragment.py": "class fragment_address:\n    pass\n",
}


@contextmanager
def _stand_ins(folder: Path) -> Iterator[None]:
    for name, text in _STAND_INS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        for module in [m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed.")]:
            del sys.modules[module]


def _edited(tmp_path: Path, fixture: str, edits: dict[str, Callable[[dict[str, Any]], None]],
            ) -> Path:
    """A copy of a fixture folder, each named rank file changed by its edit."""
    folder = tmp_path / fixture
    shutil.copytree(FIXTURES / fixture, folder)
    with _stand_ins(tmp_path / "stand-ins"):
        for name, edit in edits.items():
            file = folder / "step1" / name
            state = torch.load(file, weights_only=False)
            edit(state)
            torch.save(state, file)
    return folder


def _optimizer(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    return lambda state: change(state["optimizer_state_dict"])


_ZERO1_OPTIM = "zero_pp_rank_{}_mp_rank_00_optim_states.pt"
_ZERO3_OPTIM = "bf16_zero_pp_rank_{}_mp_rank_00_optim_states.pt"
_ZERO3_MODEL = "zero_pp_rank_{}_mp_rank_00_model_states.pt"


def test_an_unchanged_round_trip_still_loads_as_deepspeed_merges_it(tmp_path: Path) -> None:
    for fixture, name in (("zero1", _ZERO1_OPTIM), ("zero3_bf16", _ZERO3_OPTIM)):
        folder = _edited(tmp_path, fixture, {name.format(0): lambda state: None})
        expected = tg.load(FIXTURES / fixture / "reference.safetensors")
        loaded = tg.load(folder)
        for key, value in loaded.items():
            assert torch.equal(value, expected[f"weights/{key}"])


@pytest.mark.parametrize("count", ["2", 2.0, None, [], ["2"], True])
def test_a_partition_count_that_is_no_number_is_refused(tmp_path: Path, count: Any) -> None:
    def edit(optim: dict[str, Any]) -> None:
        optim["partition_count"] = count

    folder = _edited(tmp_path, "zero1", {_ZERO1_OPTIM.format(0): _optimizer(edit)})
    with pytest.raises(CorruptCheckpointError, match="partition_count is"):
        tg.load(folder)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fixture", ["zero1", "zero3_bf16"])
def test_fp32_partitions_stored_as_another_dtype_are_refused(tmp_path: Path, fixture: str,
                                                             dtype: torch.dtype) -> None:
    key = "single_partition_of_fp32_groups" if fixture == "zero1" else "fp32_flat_groups"
    name = _ZERO1_OPTIM if fixture == "zero1" else _ZERO3_OPTIM

    def edit(optim: dict[str, Any]) -> None:
        optim[key] = [t.to(dtype) for t in optim[key]]

    folder = _edited(tmp_path, fixture, {name.format(1): _optimizer(edit)})
    with pytest.raises(CorruptCheckpointError, match=rf"rank 1's {key}\[0\] is stored as "
                                                     f"{dtype}.*lies about their dtype"):
        tg.open(folder)


def _frozen(shape: tuple[int, ...], fragment: torch.Tensor, rank: int = 0,
            ) -> Callable[[dict[str, Any]], None]:
    def edit(state: dict[str, Any]) -> None:
        if rank == 0:
            state["frozen_param_shapes"] = {"frozen.weight": torch.Size(shape)}
        state["frozen_param_fragments"] = {"frozen.weight": fragment}
    return edit


def test_a_frozen_parameter_reads_from_its_fragments(tmp_path: Path) -> None:
    whole = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    # Stage 3: ceil(6 / 2) = 3 elements per rank, as deepspeed partitions every parameter.
    folder = _edited(tmp_path, "zero3_bf16", {
        _ZERO3_MODEL.format(0): _frozen((2, 3), whole.reshape(-1)[:3]),
        _ZERO3_MODEL.format(1): _frozen((2, 3), whole.reshape(-1)[3:], rank=1)})
    assert torch.equal(tg.load(folder)["frozen.weight"], whole.float())


@pytest.mark.parametrize("shape", [(10**6, 10**6), (2, 4), (0,)])
def test_a_frozen_shape_its_fragments_do_not_hold_is_refused(tmp_path: Path,
                                                             shape: tuple[int, ...]) -> None:
    fragment = torch.ones(2, dtype=torch.bfloat16)  # 4 elements in all, over two ranks
    folder = _edited(tmp_path, "zero3_bf16", {
        _ZERO3_MODEL.format(0): _frozen(shape, fragment),
        _ZERO3_MODEL.format(1): _frozen(shape, fragment, rank=1)})
    with pytest.raises(CorruptCheckpointError, match=r"frozen parameter 'frozen.weight' of "
                                                     r"shape .* lie about its shape"):
        tg.open(folder)
    stage1 = _edited(tmp_path / "stage1", "zero1", {
        "mp_rank_00_model_states.pt": _frozen(shape, torch.ones(4))})
    with pytest.raises(CorruptCheckpointError, match="lie about its shape"):
        tg.open(stage1)


def test_an_integer_frozen_fragment_is_refused(tmp_path: Path) -> None:
    folder = _edited(tmp_path, "zero1", {
        "mp_rank_00_model_states.pt": _frozen((2, 2), torch.ones(4, dtype=torch.int64))})
    with pytest.raises(CorruptCheckpointError, match="floating-point elements"):
        tg.open(folder)


@pytest.mark.parametrize("paddings", ["x", [[None]], [[-1]], [[0], [0]]])
def test_paddings_that_are_no_counts_are_refused(tmp_path: Path, paddings: Any) -> None:
    def edit(optim: dict[str, Any]) -> None:
        optim["param_alignment_paddings"] = paddings

    folder = _edited(tmp_path, "zero1", {_ZERO1_OPTIM.format(0): _optimizer(edit)})
    with pytest.raises(CorruptCheckpointError, match="param_alignment_paddings is"):
        tg.open(folder)


@pytest.mark.parametrize("record, value", [("buffer_names", 3), ("shared_params", [1]),
                                           ("frozen_param_fragments", "x")])
def test_model_state_records_of_the_wrong_kind_are_refused(tmp_path: Path, record: str,
                                                           value: Any) -> None:
    def edit(state: dict[str, Any]) -> None:
        state[record] = value

    folder = _edited(tmp_path, "zero1", {"mp_rank_00_model_states.pt": edit})
    if record == "frozen_param_fragments":  # only read for frozen parameters
        edit_shapes = _frozen((4,), torch.ones(4))
        folder = _edited(tmp_path / "b", "zero1", {"mp_rank_00_model_states.pt": lambda s: (
            edit_shapes(s), edit(s))})
    with pytest.raises(CorruptCheckpointError, match=f"{record} is"):
        tg.open(folder)


@pytest.mark.timeout(30)
def test_a_latest_file_that_is_a_fifo_is_not_opened(tmp_path: Path) -> None:
    folder = tmp_path / "ds"
    shutil.copytree(FIXTURES / "zero1", folder)
    (folder / "reference.safetensors").unlink()
    (folder / "latest").unlink()
    os.mkfifo(folder / "latest")
    with pytest.raises(tg.TorchgraftError):
        tg.open(folder)
    assert tg.load(folder / "step1")  # the tag folder itself still opens
