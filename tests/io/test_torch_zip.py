"""torch.save zip files: state dicts, training checkpoints, whole models, TorchScript."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.helpers import SmallNet, assert_same_state, assert_same_tensor


def test_state_dict_round_trip_bit_for_bit(tmp_path: Path, state: dict[str, torch.Tensor]) -> None:
    path = tmp_path / "model.pth"
    torch.save(state, path)
    with tg.open(path) as ckpt:
        assert ckpt.format == "torch-zip"
        assert ckpt.keys() == list(state)
        assert ckpt.meta("conv.weight") == tg.TensorMeta((8, 3, 3, 3), torch.float32,
                                                         8 * 27 * 4, "cpu")
        assert_same_tensor(ckpt.get("conv.weight"), state["conv.weight"])
    assert_same_state(tg.load(path), torch.load(path, weights_only=True))


def test_every_dtype_and_views_share_memory(tmp_path: Path) -> None:
    base = torch.randn(6, 4)
    state = {
        "f32": base, "transposed": base.t(), "row": base[2], "col": base[:, 1],
        "f16": torch.randn(3).half(), "bf16": torch.randn(3).bfloat16(),
        "f64": torch.randn(3).double(), "i64": torch.arange(4), "i8": torch.arange(4).char(),
        "u8": torch.arange(4).byte(), "bool": torch.tensor([True, False]),
        "c64": torch.randn(2, dtype=torch.complex64),
        "u16": torch.tensor([1, 2, 60000], dtype=torch.uint16),
        "f8": torch.randn(4).to(torch.float8_e4m3fn), "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 3),
    }
    path = tmp_path / "dtypes.pt"
    torch.save(state, path)
    loaded = tg.load(path)
    assert_same_state(loaded, state)
    assert loaded["row"].untyped_storage().data_ptr() == loaded["f32"].untyped_storage().data_ptr()


def test_tensors_are_memory_mapped_not_copied(tmp_path: Path) -> None:
    path = tmp_path / "big.pt"
    torch.save({"w": torch.randn(256, 1024)}, path)
    with tg.open(path) as ckpt:
        weight = ckpt.get("w")
    mapped = [line.split()[0].split("-") for line in Path("/proc/self/maps").read_text()
              .splitlines() if line.endswith(str(path))]
    assert any(int(a, 16) <= weight.data_ptr() < int(b, 16) for a, b in mapped)  # the file
    assert weight.untyped_storage().nbytes() == weight.nbytes  # its own storage, as torch's


def test_training_checkpoint_nests_weights_and_keeps_extras(
        tmp_path: Path, model: SmallNet) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    optimizer.step()
    path = tmp_path / "ckpt.pth.tar"
    torch.save({"epoch": 3, "step": 1200, "model_state_dict": model.state_dict(),
                "optimizer_state_dict": optimizer.state_dict(), "best": 0.5}, path)
    with tg.open(path) as ckpt:
        assert ckpt.weights_key == "model_state_dict"
        assert ckpt.keys() == list(model.state_dict())
        assert ckpt.extras["epoch"] == 3
        assert ckpt.extras["best"] == 0.5
        summary = ckpt.extras["optimizer_state_dict"]
        assert summary["param_groups"][0]["lr"] == 1e-3
        assert "optimizer state for 6 parameters: 18 tensors" in summary["state"]
    assert_same_state(tg.load(path), model.state_dict())


_WHOLE_MODEL_WRITER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[1])
    from lab_models import Net
    torch.manual_seed(0)
    net = Net()
    torch.save(net, sys.argv[2])
    torch.save(net.state_dict(), sys.argv[3])
    torch.save({"epoch": 1, "model": net}, sys.argv[4])
""")
_LAB_MODELS = textwrap.dedent("""
    import torch
    from torch import nn
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.register_buffer("cache", torch.ones(3), persistent=False)
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.head = nn.Linear(4, 2)
            self.unused = None
""")


@pytest.mark.slow
def test_whole_model_whose_class_is_not_importable(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "lab_models.py").write_text(_LAB_MODELS)
    whole, reference, nested = tmp_path / "whole.pt", tmp_path / "ref.pt", tmp_path / "nested.pt"
    subprocess.run([sys.executable, "-c", _WHOLE_MODEL_WRITER, str(code), str(whole),
                    str(reference), str(nested)], check=True)
    expected = torch.load(reference, weights_only=True)
    with tg.open(whole) as ckpt:
        assert ckpt.model_class == "lab_models.Net"
        assert "block.cache" not in ckpt.keys()
        assert_same_state({k: ckpt.get(k) for k in ckpt.keys()}, expected)
    with tg.open(nested) as ckpt:
        assert ckpt.weights_key == "model"
        assert ckpt.extras == {"epoch": 1}
        assert_same_state(dict(zip(ckpt.keys(), map(ckpt.get, ckpt.keys()), strict=True)),
                          expected)


def test_torchscript_archive(tmp_path: Path, model: SmallNet) -> None:
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(model.eval()), path)
    with tg.open(path) as ckpt:
        assert ckpt.model_class == "__torch__.tests.helpers.SmallNet"
    assert_same_state(tg.load(path), torch.jit.load(path).state_dict())


def test_dataparallel_and_compile_wrappers_are_reported(tmp_path: Path, model: SmallNet) -> None:
    path = tmp_path / "dp.pt"
    torch.save(nn.DataParallel(torch.compile(model)).state_dict(), path)
    info = tg.inspect(path)
    assert [w.prefix for w in info.wrappers] == ["module.", "_orig_mod."]
    assert info.tensors[0][0] == "module._orig_mod.conv.weight"


#: The zip's length and place fields, as :func:`tests.io.fields.fields` describes them.
_ZIP_FIELDS = ("compressed size", "' size", "size", "name length", "extra length",
               "local header offset", "entries", "central directory")


def _named_or_loaded(work: Callable[[], object], path: Path) -> str | None:
    """``None`` when ``work`` succeeds or raises a library error naming ``path`` (neither a
    descriptor nor another file); else what went wrong."""
    try:
        work()
    except tg.TorchgraftError as exc:
        message = str(exc)
        if not message.startswith(str(path)) or "/proc/self/fd" in message:
            return f"names another file: {message}"
    except Exception as exc:  # what the test looks for
        return f"raw {type(exc).__name__}: {exc}"
    return None


@pytest.mark.parametrize("suffix", [".pt", ".npz"])
def test_every_zip_length_field_lying_loads_the_same_or_is_refused_naming_the_file(
        tmp_path: Path, suffix: str) -> None:
    """Each length and place field of the zip (local headers, central records, the end
    record), set to what a forger writes, through load, graft and convert: the tensors
    loaded are the saved ones, or the error names the checkpoint (a local header's name length
    of 65,535 was reported as '/proc/self/fd/6: ... the file shrank while open', and by
    convert as the output's error)."""
    import numpy as np

    from tests.io.fields import fields, with_value
    from tests.test_fuzz import _Net, _state

    state = _state()
    seed = tmp_path / f"seed{suffix}"
    if suffix == ".pt":
        torch.save(state, seed)
    else:
        np.savez(seed, **{k: v.numpy() for k, v in state.items()})
    data = seed.read_bytes()
    mutant = tmp_path / f"m{suffix}"
    lengths = [f for f in fields(data) if any(w in f.what for w in _ZIP_FIELDS)
               and "pickle" not in f.what]
    assert {"name length", "extra length", "local header offset"} <= {
        w for f in lengths for w in _ZIP_FIELDS if w in f.what}

    def loaded_the_same() -> None:
        loaded = tg.load(mutant)
        if sorted(loaded) == sorted(state):  # an entry's name changed is another key
            assert all(torch.equal(loaded[k], v) for k, v in state.items()), "other values"

    failures = []
    for field in lengths:
        value = int.from_bytes(data[field.offset:field.offset + field.width], "little")
        top = (1 << (8 * field.width)) - 1
        for changed in sorted({0, value - 1, value + 1, value + 64, top, len(data) + 1} - {value}):
            mutant.write_bytes(with_value(data, field, changed))
            for what, work in (("load", loaded_the_same),
                               ("graft", lambda: tg.graft(mutant, _Net())),
                               ("convert", lambda: tg.convert(
                                   mutant, tmp_path / "out.safetensors", overwrite=True))):
                problem = _named_or_loaded(work, mutant)
                if problem is not None:
                    failures.append(f"{what}: {field.what} at {field.offset} = {changed}: "
                                    f"{problem}")
    assert not failures, "\n".join(failures[:10])


def test_a_file_that_shrinks_while_open_is_named_by_its_path(tmp_path: Path) -> None:
    """The descriptor a held file is read through (``/proc/self/fd/N``) is never the name in
    a message: reads in runs (a graft) and copies in the kernel (convert) name the file."""
    from tests.test_fuzz import _Net, _state
    from torchgraft.io.copy import FileCopier

    path = tmp_path / "m.pt"
    torch.save(_state(), path)
    with tg.open(path) as ckpt:
        with path.open("r+b") as f:
            f.truncate(600)
        with pytest.raises(tg.CorruptCheckpointError) as caught:
            tg.graft(ckpt, _Net())
    held = os.open(path, os.O_RDONLY)
    try:
        with (tmp_path / "out").open("wb") as out, FileCopier(out.fileno()) as copier, \
                pytest.raises(tg.CorruptCheckpointError) as copied:
            copier.copy(f"/proc/self/fd/{held}", 500, 200, what="'w'")
    finally:
        os.close(held)
    for error in (caught.value, copied.value):
        assert str(error).startswith(f"{path}: "), error
        assert "shrank" in str(error) and "/proc/self/fd" not in str(error)
