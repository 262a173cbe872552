"""One battery over the registry of formats: every registered reader is covered the day it is.

For each format a real file is written by the library that writes it (:data:`SEEDS`; a format
without a seed fails :func:`test_every_registered_format_has_a_seed`). Its structure file is
then damaged in the ways a file gets damaged or forged: truncated at every byte of its start,
at every zip record and at spread points; a bit flipped in every byte of its first 64; every
aligned 4- and 8-byte field there set to 0, -1, 2^31 (4-byte), 2^63 (8-byte) and the
file's size + 1; nested 100,000 deep. Then every structural field of every structure file
of the format (:data:`STRUCTURE`), found by parsing the valid file (:mod:`tests.io.fields`:
zip records, pickle lengths and integers, legacy storages' counts, ``.npy`` headers, JSON
integers, GGUF counts, lengths, dimensions and offsets, msgpack lengths, protobuf varints,
HDF5 addresses and data offsets), is set to 0, -1, 2^31, 2^63 and the file's size + 1.
Each mutant must load with ``meta()`` and ``get()`` agreeing, or raise a library error,
within its CPU budget, under a capped address space, and leave no descriptor open. A refused
file is opened 5,000 times per format in one process. Every reader's decoders get their
nesting bomb (:data:`BOMBS`), and every file a reader opens besides the one named, made a
link out of the folder, is refused (and read where the links are followed).
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
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from tests.io.fields import Field, fields, with_value
from tests.test_fuzz import _Net, _state
from torchgraft.bounds import MAX_NESTING
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


#: Each format's structure files besides its seed's target, relative to the folder that holds
#: what is opened (the opened folder itself for a folder format).
STRUCTURE: dict[str, tuple[str, ...]] = {
    "dcp/folder": ("__0_0.distcp",),
    "deepspeed/folder": ("step1/zero_pp_rank_1_mp_rank_00_optim_states.pt", "latest"),
    "components/folder": ("model.safetensors", "2_Dense/config.json"),
    "mlx/folder": ("model.safetensors", "config.json"),
    "orbax/folder": ("_METADATA",),
    "sharded/.index.json": ("model-00001-of-00002.safetensors",),
}


def structure_files(name: str, opened: Path, target: Path) -> list[Path]:
    """The seed's target and the format's other structure files (:data:`STRUCTURE`)."""
    folder = opened if opened.is_dir() else opened.parent
    return [target, *(folder / part for part in STRUCTURE.get(name, ()))]


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
    """Open and read every tensor; ``None`` when it loads or is refused by a library error
    naming the checkpoint (its path, or a file in its folder; never a descriptor).

    Returns:
        What went wrong otherwise: a raw exception, an error naming no file of the
        checkpoint, or ``meta()`` disagreeing with ``get()``.
    """
    folder = path if path.is_dir() else path.parent
    try:
        with tg.open(path) as ckpt:
            for name in ckpt.keys():
                meta, value = ckpt.meta(name), ckpt.get(name)
                if tuple(value.shape) != meta.shape or value.dtype != meta.dtype:
                    return f"'{name}': meta says {meta.dtype} {meta.shape}, get gives " \
                           f"{value.dtype} {tuple(value.shape)}"
    except tg.TorchgraftError as exc:
        if exc.path is None or not exc.path.startswith(str(folder)) or \
                "/proc/self/fd" in str(exc):
            return f"names no file of the checkpoint: {exc}"
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


#: The values every structural field is set to, besides the file's size + 1.
BOUNDARIES = (0, -1, 1 << 31, 1 << 63)
#: Fields damaged per structure file: every kind of field (its description), at places spread
#: through the file, up to this many (all with ``TORCHGRAFT_FULL_BATTERY=1``: several minutes).
FIELDS_PER_FILE = None if os.environ.get("TORCHGRAFT_FULL_BATTERY") else 32


def spread(found: list[Field], limit: int | None) -> list[Field]:
    """Up to ``limit`` fields: each kind once, then more of each kind, spread through it."""
    if limit is None or len(found) <= limit:
        return found
    kinds: dict[str, list[Field]] = {}
    for field in found:
        kinds.setdefault(field.what, []).append(field)
    chosen: list[Field] = []
    rounds = 0
    while len(chosen) < limit:
        for group in kinds.values():
            if rounds < len(group) and len(chosen) < limit:
                # evenly spread: the first, the last, then the middles
                order = sorted(range(len(group)), key=lambda i: (i != 0, i != len(group) - 1,
                                                                  abs(i - len(group) // 2)))
                chosen.append(group[order[rounds]])
        rounds += 1
    return sorted(chosen, key=lambda f: f.offset)


def boundary_mutants(data: bytes, hint: str = "") -> Iterator[tuple[str, bytes]]:
    """``data`` with each structural field in turn set to each boundary, and to its size + 1."""
    for field in spread(fields(data, hint=hint), FIELDS_PER_FILE):
        for value in (*BOUNDARIES, len(data) + 1):
            yield (f"{field.what} (byte {field.offset}) set to {value}",
                   with_value(data, field, value))


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_every_structural_field_at_a_boundary_loads_or_is_refused(
        seeds: dict[str, tuple[Path, Path]], name: str, tmp_path: Path) -> None:
    opened, target = seeds[name]
    work = tmp_path / "work"
    shutil.copytree(opened.parent, work, symlinks=True)
    mutant_open = work / opened.relative_to(opened.parent)
    failures: list[str] = []
    before = _fd_count()
    for structure in structure_files(name, opened, target):
        mutant = work / structure.relative_to(opened.parent)
        original = structure.read_bytes()
        found = fields(original, hint="onnx" if name.startswith("onnx") else "")
        assert found or structure.name == "latest", f"no fields found in {structure}"
        with _capped(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for what, data in boundary_mutants(original, "onnx" if name.startswith("onnx")
                                               else ""):
                mutant.write_bytes(data)
                start = time.process_time()
                problem = read_fully(mutant_open)
                spent = time.process_time() - start
                if problem is not None or spent > MUTANT_CPU:
                    failures.append(f"{structure.name}: {what}: "
                                    f"{problem or f'{spent:.1f} s of CPU'}")
        mutant.write_bytes(original)
    assert _fd_count() == before
    assert not failures, "\n".join(failures[:20])


def _nested_pickle(depth: int) -> bytes:
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def _nested_calls(depth: int) -> bytes:
    """``f(f(f(...())))``: calls of an unknown global, no recursion to build or read."""
    return (b"\x80\x02cfoo\nf\nq\x00" + b"h\x00" * (depth - 1) + b")"
            + b"R\x85" * (depth - 1) + b"R.")


def _nested_json(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def _file(name: str, data: bytes) -> Callable[[Path, dict[str, tuple[Path, Path]]], Path]:
    def build(folder: Path, seeds: dict[str, tuple[Path, Path]]) -> Path:
        (folder / name).write_bytes(data)
        return folder / name
    return build


def _member_replaced(seed: str, member: str, data: bytes,
                     ) -> Callable[[Path, dict[str, tuple[Path, Path]]], Path]:
    """A copy of a seed's zip archive whose ``member`` (its name's end) holds ``data``."""
    def build(folder: Path, seeds: dict[str, tuple[Path, Path]]) -> Path:
        import zipfile

        opened, _ = seeds[seed]
        path = folder / opened.name
        with zipfile.ZipFile(opened) as source, zipfile.ZipFile(path, "w") as out:
            for info in source.infolist():
                out.writestr(info, data if info.filename.endswith(member)
                             else source.read(info))
        return path
    return build


def _in_folder(seed: str, part: str, data: bytes,
               ) -> Callable[[Path, dict[str, tuple[Path, Path]]], Path]:
    """A copy of a folder seed with ``part`` holding ``data``."""
    def build(folder: Path, seeds: dict[str, tuple[Path, Path]]) -> Path:
        opened, _ = seeds[seed]
        copy = folder / opened.name
        shutil.copytree(opened, copy)
        (copy / part).write_bytes(data)
        return copy
    return build


def _hdf5_groups(folder: Path, seeds: dict[str, tuple[Path, Path]]) -> Path:
    import h5py

    path = folder / "deep.weights.h5"
    with h5py.File(path, "w") as f:
        group = f.create_group("layers")
        for i in range(MAX_NESTING + 20):
            group = group.create_group(f"g{i}")
    return path


def _onnx_subgraphs(folder: Path, seeds: dict[str, tuple[Path, Path]]) -> Path:
    def field(number: int, payload: bytes) -> bytes:
        size, length = len(payload), bytearray()
        while True:
            length.append((size & 0x7F) | (0x80 if size > 0x7F else 0))
            size >>= 7
            if not size:
                return bytes([number << 3 | 2]) + bytes(length) + payload

    node = field(4, b"Identity")
    for _ in range(2000):  # If { then_branch: graph { If { ... } } }
        node = field(4, b"If") + field(5, field(1, b"then") + b"\x20\x05"
                                       + field(6, field(1, node)))
    path = folder / "deep.onnx"
    path.write_bytes(b"\x08\x08" + field(7, field(1, node)))
    return path


def _gguf_arrays(depth: int) -> bytes:
    key = struct.pack("<Q", 1) + b"a"
    arrays = (struct.pack("<I", 9) + struct.pack("<Q", 1)) * depth
    return (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + key + struct.pack("<I", 9) + arrays
            + struct.pack("<IQ", 4, 0))


def _npy_literal(depth: int) -> bytes:
    header = ("{'descr': '<f4', 'fortran_order': False, 'shape': " + "(" * depth + ")" * depth
              + ", }").encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


#: Every reader's decoders, each given its nesting bomb: a builder of the file or folder to
#: open (from the seeds where the bomb sits inside a real checkpoint), and whether opening
#: must refuse it (else it may open as something else, read in full).
BOMBS: dict[str, tuple[Callable[[Path, dict[str, tuple[Path, Path]]], Path], bool]] = {
    "pickle lists": (_file("deep.pkl", _nested_pickle(100_000)), True),
    "pickle calls": (_file("calls.pkl", _nested_calls(100_000)), True),
    "torch zip data.pkl": (_member_replaced("torch-zip/.pt", "data.pkl",
                                            _nested_pickle(100_000)), True),
    "index JSON": (_file("model.safetensors.index.json", b"[" * 100_000 + b"]" * 100_000),
                   True),
    "safetensors header": (_file("deep.safetensors", struct.pack(
        "<Q", 50_000 * 5 + 50_002) + b"{" + b'"a":{' * 50_000 + b"}" * 50_001), True),
    "npy header": (_file("deep.npy", _npy_literal(4_900)), True),  # numpy reads 10,000 bytes
    "msgpack maps": (_file("deep.msgpack", b"\x81\xa1a" * 100_000 + b"\xc0"), True),
    "HDF5 groups": (_hdf5_groups, True),
    "ONNX subgraphs": (_onnx_subgraphs, True),
    "GGUF arrays": (_file("deep.gguf", _gguf_arrays(100_000)), True),
    "torch.export config JSON": (_member_replaced(
        "torch-export/.pt2", "weights_config.json", _nested_json(100_000)), True),
    "Keras config.json": (_member_replaced("keras/.keras", "config.json",
                                           _nested_json(100_000)), True),
    "DCP .metadata": (_in_folder("dcp/folder", ".metadata", _nested_pickle(100_000)), True),
    "DeepSpeed rank file": (_in_folder("deepspeed/folder",
                                       "step1/zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                       _nested_pickle(100_000)), True),
    "Orbax _METADATA": (_in_folder("orbax/folder", "_METADATA",
                                   b'{"tree_metadata": ' + _nested_json(100_000) + b"}"), True),
    "components modules.json": (_in_folder("components/folder", "modules.json",
                                           b"[" * 100_000 + b"]" * 100_000), True),
    "MLX config.json": (_in_folder("mlx/folder", "config.json", _nested_json(100_000)), False),
}


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_every_decoders_nesting_bomb_is_refused_in_bounded_time(
        seeds: dict[str, tuple[Path, Path]], bomb: str, tmp_path: Path) -> None:
    build, refused = BOMBS[bomb]
    path = build(tmp_path, seeds)
    before = _fd_count()
    with _capped(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.process_time()
        assert read_fully(path) is None
        if refused:
            with pytest.raises(tg.TorchgraftError) as caught:
                tg.open(path)
            # the message names the file and the bound; it never renders the bomb
            assert len(str(caught.value)) < len(str(path)) + 400, str(caught.value)[:2000]
        spent = time.process_time() - start
    assert spent < MUTANT_CPU, f"{spent:.1f} s of CPU"
    assert _fd_count() == before


def _opened_during(work: Callable[[], object]) -> set[Path]:
    """Every file opened by Python code (``os.open``, ``open``) while ``work`` runs."""
    import builtins
    import io

    seen: set[Path] = set()
    real_os_open, real_open, real_io_open = os.open, builtins.open, io.open

    def record(file: object) -> None:
        if isinstance(file, (str, os.PathLike)):
            seen.add(Path(os.fspath(file)))

    def os_open(file: Any, *args: Any, **kwargs: Any) -> int:
        record(file)
        return real_os_open(file, *args, **kwargs)

    def any_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        record(file)
        return real_open(file, *args, **kwargs)

    os.open, builtins.open, io.open = os_open, any_open, any_open  # type: ignore[assignment]
    try:
        work()
    finally:
        os.open, builtins.open, io.open = real_os_open, real_open, real_io_open
    return seen


def parts(opened: Path) -> list[Path]:
    """The files a reader opens besides the one named, inside the seed's folder (relative)."""
    folder = opened if opened.is_dir() else opened.parent
    found = {p.resolve() for p in _opened_during(lambda: read_fully(opened))}
    if opened.is_dir() and (opened / "manifest.ocdbt").exists():  # tensorstore opens the rest
        found |= {p.resolve() for p in opened.rglob("*") if p.is_file()}
    inside = [p.relative_to(folder.resolve()) for p in found
              if p.is_relative_to(folder.resolve()) and p != opened.resolve()]
    return sorted(inside)


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_every_part_linking_out_of_the_folder_is_refused_or_left_unread(
        seeds: dict[str, tuple[Path, Path]], name: str, tmp_path: Path) -> None:
    opened, _ = seeds[name]
    folder_format = opened.is_dir()
    expected = {k: v for k, v in tg.load(opened).items()}
    failures = []
    for part in parts(opened):
        work = tmp_path / "work" / str(part).replace("/", "_")
        shutil.copytree(opened.parent, work, symlinks=True)
        mutant = work / opened.relative_to(opened.parent)
        linked = (mutant if folder_format else mutant.parent) / part
        outside = tmp_path / "outside" / str(part).replace("/", "_")
        outside.parent.mkdir(exist_ok=True)
        shutil.move(linked, outside)
        linked.symlink_to(outside)
        try:  # refused, or left unread (a file only looked at to tell the format)
            if outside.resolve() in {p.resolve() for p in _opened_during(
                    lambda mutant=mutant: tg.load(mutant))}:
                failures.append(f"{part}: a link out of the folder was read")
        except tg.OutsideCheckpointError:
            pass
        except Exception as exc:  # what the battery reports
            failures.append(f"{part}: {type(exc).__name__}: {exc}")
        loaded = tg.load(mutant, follow_links=True)  # the user trusts where it leads
        if loaded.keys() != expected.keys():
            failures.append(f"{part}: with follow_links, other keys")
    assert not failures, "\n".join(failures)


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
