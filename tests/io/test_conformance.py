"""One battery over the registry of formats: every registered reader is covered the day it is.

For each format a real file is written by the library that writes it (:data:`SEEDS`; a format
without a seed fails :func:`test_every_registered_format_has_a_seed`). Its structure file is
then damaged in the ways a file gets damaged or forged: truncated at every byte of its start,
at every zip record and at spread points; a bit flipped in every byte of its first 64; every
aligned 4- and 8-byte field there set to 0, -1, 2^31 (4-byte), 2^63 (8-byte) and the
file's size + 1; nested 100,000 deep. Each mutant must load with ``meta()`` and ``get()``
agreeing, or raise a library error, within its CPU budget, under a capped address space, and
leave no descriptor open. A refused file is opened 5,000 times per format in one process.
"""

from __future__ import annotations

import os
import pickle
import resource
import shutil
import struct
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from tests.test_fuzz import _Net, _state
from torchgraft.io import formats
from torchgraft.io.base import Format

FIXTURES = Path(__file__).parent.parent / "fixtures"
#: CPU seconds one mutant may take (open, load every tensor, compare).
MUTANT_CPU = 2.0
#: Address space the battery may add, beyond what the process has.
MEMORY = 2 << 30
#: The bytes of a structure file whose every bit position and aligned field is damaged: where
#: every format keeps its header, magic, lengths and first offsets.
HEADER = 64


def key(fmt: Format) -> str:
    """A registered format's name in this battery (``numpy/.npz``: formats share names)."""
    if fmt.suffixes:
        return f"{fmt.name}/{fmt.suffixes[0]}"
    return f"{fmt.name}/folder" if fmt.claims_directory is not None else fmt.name


#: Builds a real file: (what to open, the file whose bytes are damaged).
Seed = Callable[[Path], tuple[Path, Path]]


def _file(name: str, write: Callable[[Path], None]) -> Seed:
    def build(folder: Path) -> tuple[Path, Path]:
        path = folder / name
        write(path)
        return path, path
    return build


def _paddle(path: Path) -> None:
    with path.open("wb") as f:  # what paddle.save writes: a pickle of numpy arrays
        pickle.dump({k: v.numpy() for k, v in _state().items()}, f, protocol=2)


def _export(path: Path) -> None:
    torch.manual_seed(0)
    torch.export.save(torch.export.export(_Net(), (torch.randn(1, 3, 5, 5),)), path)


def _dcp(folder: Path) -> tuple[Path, Path]:
    from torch.distributed.checkpoint import save

    path = folder / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save(_state(), checkpoint_id=str(path))
    return path, path / ".metadata"


def _sharded(folder: Path) -> tuple[Path, Path]:
    tg.save(_state(), folder / "sharded" / "model.safetensors", max_shard_size=200)
    index = folder / "sharded" / "model.safetensors.index.json"
    return index, index


def _copy(fixture: str, target: str) -> Seed:
    def build(folder: Path) -> tuple[Path, Path]:
        path = folder / Path(fixture).name
        shutil.copytree(FIXTURES / fixture, path)
        return path, path / target
    return build


def _copy_file(fixture: str) -> Seed:
    def build(folder: Path) -> tuple[Path, Path]:
        path = folder / Path(fixture).name
        shutil.copy(FIXTURES / fixture, path)
        return path, path
    return build


def _onnx(path: Path) -> None:
    torch.manual_seed(0)
    torch.onnx.export(_Net(), (torch.randn(1, 3, 5, 5),), str(path), dynamo=False)


SEEDS: dict[str, Seed] = {
    "torch-legacy": _file("legacy.pth", lambda p: torch.save(
        _state(), p, _use_new_zipfile_serialization=False)),
    "torch-export/.pt2": _file("m.pt2", _export),
    "torch-zip/.pt": _file("m.pt", lambda p: torch.save({"state_dict": _state(), "epoch": 3}, p)),
    "numpy/.npz": _file("m.npz", lambda p: np.savez(p, **{k: v.numpy()
                                                          for k, v in _state().items()})),
    "numpy/.npy": _file("m.npy", lambda p: np.save(p, _state()["fc.weight"].numpy())),
    "safetensors/.safetensors": _file("m.safetensors", lambda p: save_file(_state(), p)),
    "paddle/.pdparams": _file("m.pdparams", _paddle),
    "sharded/.index.json": _sharded,
    "dcp/folder": _dcp,
    "deepspeed/folder": _copy("deepspeed/zero1", "step1/mp_rank_00_model_states.pt"),
    "components/folder": _copy("sentence-transformers/st", "modules.json"),
    # Written by the frameworks' own save functions (scripts/make_framework_fixtures.py).
    "keras/.keras": _copy_file("frameworks/keras/cnn.keras"),
    "keras/.h5": _copy_file("frameworks/keras/cnn.weights.h5"),
    "mlx": _copy_file("frameworks/mlx/cnn.safetensors"),
    "mlx/folder": _copy("frameworks/mlx/llama_q4", "model.safetensors.index.json"),
    "gguf/.gguf": _copy_file("frameworks/gguf/llama_mixed.gguf"),
    "onnx/.onnx": _file("m.onnx", _onnx),
    "flax/.msgpack": _copy_file("frameworks/flax/cnn.msgpack"),
    "orbax/folder": _copy("frameworks/orbax/cnn", "manifest.ocdbt"),
}


def test_every_registered_format_has_a_seed() -> None:
    assert sorted(key(f) for f in formats()) == sorted(SEEDS)


def _le(value: int, width: int) -> bytes:
    return (value % (1 << (8 * width))).to_bytes(width, "little")


def mutants(data: bytes) -> Iterator[tuple[str, bytes]]:
    """The damaged versions of ``data`` the battery reads."""
    size = len(data)
    cuts = set(range(min(64, size))) | {size * k // 32 for k in range(32)} | {size - 1}
    cuts |= {i for i in range(size) if data.startswith((b"PK\x03\x04", b"PK\x01\x02",
                                                        b"PK\x05\x06"), i)}
    for cut in sorted(cuts):
        yield f"truncated at {cut}", data[:cut]
    head = min(HEADER, size)
    for at in range(head):
        flipped = bytearray(data)
        flipped[at] ^= 1 << (at % 8)
        yield f"bit {at % 8} of byte {at} flipped", bytes(flipped)
    for width, values in ((4, (0, -1, 1 << 31, size + 1)), (8, (0, -1, 1 << 63, size + 1))):
        for at in range(0, head - width + 1, width):
            for value in values:
                yield (f"{width}-byte field at {at} set to {value}",
                       data[:at] + _le(value, width) + data[at + width:])


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextmanager
def _capped() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    vm = next(int(line.split()[1]) * 1024 for line in
              Path("/proc/self/status").read_text().splitlines() if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + MEMORY, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def read_fully(path: Path) -> str | None:
    """Open and read every tensor; ``None`` when it loads or is refused by a library error.

    Returns:
        What went wrong otherwise: a raw exception, or ``meta()`` disagreeing with ``get()``.
    """
    try:
        with tg.open(path) as ckpt:
            for name in ckpt.keys():
                meta, value = ckpt.meta(name), ckpt.get(name)
                if tuple(value.shape) != meta.shape or value.dtype != meta.dtype:
                    return f"'{name}': meta says {meta.dtype} {meta.shape}, get gives " \
                           f"{value.dtype} {tuple(value.shape)}"
    except tg.TorchgraftError:
        return None
    except Exception as exc:  # what the battery looks for
        return f"raw {type(exc).__name__}: {exc}"
    return None


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    folder = tmp_path_factory.mktemp("seeds")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = {}
        for name, build in SEEDS.items():
            (folder / name.replace("/", "_")).mkdir()
            built[name] = build(folder / name.replace("/", "_"))
        return built


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_the_seed_loads_and_meta_agrees_with_get(seeds: dict[str, tuple[Path, Path]],
                                                 name: str) -> None:
    opened, _ = seeds[name]
    assert read_fully(opened) is None
    assert len(tg.load(opened)) > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SEEDS))
def test_damaged_files_load_or_are_refused(seeds: dict[str, tuple[Path, Path]],
                                           name: str, tmp_path: Path) -> None:
    opened, target = seeds[name]
    work = tmp_path / "work"
    shutil.copytree(opened.parent, work, symlinks=True)
    mutant_open = work / opened.relative_to(opened.parent)
    mutant_target = work / target.relative_to(opened.parent)
    original = target.read_bytes()
    failures: list[str] = []
    before = _fd_count()
    with _capped(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for what, data in mutants(original):
            mutant_target.write_bytes(data)
            start = time.process_time()
            problem = read_fully(mutant_open)
            spent = time.process_time() - start
            if problem is not None or spent > MUTANT_CPU:
                failures.append(f"{what}: {problem or f'{spent:.1f} s of CPU'}")
    assert _fd_count() == before
    assert not failures, "\n".join(failures[:20])


def _nested_pickle(depth: int) -> bytes:
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def test_nesting_bombs_are_refused(tmp_path: Path) -> None:
    pickled = tmp_path / "deep.pkl"
    pickled.write_bytes(_nested_pickle(100_000))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text("[" * 100_000 + "]" * 100_000)
    header = ("{" + '"a":{' * 50_000 + "}" * 50_001).encode()
    safetensors = tmp_path / "deep.safetensors"
    safetensors.write_bytes(struct.pack("<Q", len(header)) + header)
    for path in (pickled, index, safetensors):
        start = time.process_time()
        assert read_fully(path) is None
        with pytest.raises(tg.TorchgraftError):
            tg.open(path)
        assert time.process_time() - start < MUTANT_CPU


def _refused(seed: tuple[Path, Path], folder: Path) -> Path:
    """A copy of the seed whose structure file is cut in half: refused on open."""
    opened, target = seed
    work = folder / "refused"
    shutil.copytree(opened.parent, work, symlinks=True)
    damaged = work / target.relative_to(opened.parent)
    data = target.read_bytes()
    damaged.write_bytes(data[:len(data) // 2])
    return work / opened.relative_to(opened.parent)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SEEDS))
def test_refused_files_keep_no_descriptor(seeds: dict[str, tuple[Path, Path]], name: str,
                                          tmp_path: Path) -> None:
    path = _refused(seeds[name], tmp_path)
    with pytest.raises(tg.TorchgraftError):
        tg.open(path)
    before = _fd_count()
    for _ in range(5000):
        with suppress(tg.TorchgraftError):
            tg.open(path).close()
    assert _fd_count() == before


@pytest.mark.parametrize("suffix", [".safetensors", ".npz", ".npy", ".pt", ".pth"])
def test_a_file_replaced_after_open_is_not_read(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"m{suffix}"
    old, new = {"w": torch.ones(4, 4)}, {"w": torch.full((4, 4), 7.0)}

    def write(state: dict[str, torch.Tensor], where: Path) -> None:
        if suffix == ".safetensors":
            save_file(state, where)
        elif suffix == ".npz":
            np.savez(where, **{k: v.numpy() for k, v in state.items()})
        elif suffix == ".npy":
            np.save(where, state["w"].numpy())
        else:
            torch.save(state, where, _use_new_zipfile_serialization=suffix == ".pt")

    write(old, path)
    with tg.open(path) as ckpt:
        replacement = tmp_path / f"new{suffix}"
        write(new, replacement)
        os.replace(replacement, path)
        name = ckpt.keys()[0]
        assert torch.equal(ckpt.get(name), old["w"])
    assert torch.equal(tg.load(path)[name], new["w"])


def test_graft_and_convert_read_the_file_held_not_its_replacement(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    old = {"weight": torch.ones(4, 4), "bias": torch.ones(4)}
    save_file(old, path)
    with tg.open(path) as ckpt:
        save_file({k: torch.full_like(v, 7.0) for k, v in old.items()}, tmp_path / "new")
        os.replace(tmp_path / "new", path)
        model = torch.nn.Linear(4, 4)
        assert tg.graft(ckpt, model).ok
        assert torch.equal(model.weight.detach(), old["weight"])
        tg.convert(tmp_path / "m.safetensors", tmp_path / "other.safetensors")  # the new file
    assert torch.equal(tg.load(tmp_path / "other.safetensors")["weight"], torch.full((4, 4), 7.0))
