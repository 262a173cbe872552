"""Hostile files, each with what reading it must end in, measured for CPU time and memory.

Run as a script (``python -m tests.hostile_cases OUT_DIR``: the notes' table), it writes
every case under OUT_DIR, reads each in this one process (peak memory reset between cases through
``/proc/self/clear_refs``), and prints one JSON line per case: CPU seconds, peak resident
memory above the baseline, the file's size, and the error's class and message. The address
space is capped first, so a case that escapes its bound fails rather than swapping.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import torchgraft as tg
from torchgraft.io.torch_legacy import MAGIC_NUMBER, PROTOCOL_VERSION

__all__ = ["CASES", "OUTCOMES", "measure"]

Case = Callable[[Path], Callable[[], object]]
FIXTURES = Path(__file__).parent / "fixtures"
#: The record and walk cases' sizes are divided by this (``TORCHGRAFT_HOSTILE_SCALE``; 1: the
#: sizes in their names, as measured for the notes; CI runs them at a tenth).
SCALE = int(os.environ.get("TORCHGRAFT_HOSTILE_SCALE", "1"))


def _legacy_prefix() -> bytes:
    return b"".join(pickle.dumps(v, protocol=2) for v in (
        MAGIC_NUMBER, PROTOCOL_VERSION, {"protocol_version": PROTOCOL_VERSION,
                                         "little_endian": True}))


def _pickle_file(folder: Path, name: str, body: bytes, *, legacy: bool = False) -> Path:
    path = folder / name
    path.write_bytes((_legacy_prefix() if legacy else b"") + body)
    return path


def _opener(path: Path) -> Callable[[], object]:
    return lambda: tg.load(path)


# Length opcodes claiming more than the file holds.
_BINUNICODE_4G = b"\x80\x04X" + (0xFFFFFFF0).to_bytes(4, "little") + b"abc"
_FRAME_2_40 = b"\x80\x04\x95" + (1 << 40).to_bytes(8, "little") + b"N."
_BINBYTES8_2_62 = b"\x80\x04\x8e" + (1 << 62).to_bytes(8, "little") + b"x"
_BYTEARRAY8_2_40 = b"\x80\x05\x96" + (1 << 40).to_bytes(8, "little") + b"x"


class _Ndarray:
    """Pickles as ``numpy.ndarray((2**33,))``: a call that would reserve 64 GiB."""

    def __reduce__(self) -> tuple[object, ...]:
        import numpy as np

        return (np.ndarray, ((1 << 33,),))


def _distinct_globals(count: int) -> bytes:
    items = b"".join(b"cm%d\nC\n)R" % i for i in range(count))
    return b"\x80\x02(" + items + b"l."


def _repeated_call(count: int) -> bytes:
    return b"\x80\x02cm\nC\nq\x00(" + b"h\x00)R" * count + b"l."


def _wide_call(count: int) -> bytes:
    return b"\x80\x02cm\nC\n(" + b"K\x01" * count + b"tR."


def _quick_memo_bomb(folder: Path) -> Callable[[], object]:
    """A DCP folder whose ``.metadata`` stores one memo entry at index 2^27 (a 2 GiB memo),
    read as ``torchgraft inspect`` reads it: the quick reader first, then the full one."""
    from torchgraft.quick_inspect import quick_inspect

    path = folder / "dcp"
    path.mkdir()
    (path / "__0_0.distcp").write_bytes(b"")
    (path / ".metadata").write_bytes(b"\x80\x02Nr" + (1 << 27).to_bytes(4, "little") + b".")

    def read() -> object:
        assert quick_inspect(path) is None
        return tg.inspect(path)
    return read


def _zip_name_length(folder: Path) -> Callable[[], object]:
    """A torch zip whose first storage's local header claims a 65,535-byte name."""
    import struct
    import zipfile

    path = folder / "m.pt"
    torch.save({"w": torch.ones(64)}, path)
    with zipfile.ZipFile(path) as archive:
        offset = next(i.header_offset for i in archive.infolist() if "/data/" in i.filename)
    data = bytearray(path.read_bytes())
    data[offset + 26:offset + 28] = struct.pack("<H", 65535)
    path.write_bytes(bytes(data))
    return lambda: tg.convert(path, folder / "out.safetensors")


def _quick_chunk_flood(folder: Path) -> Callable[[], object]:
    """A DCP folder of 4 tensors of 4,096 one-element chunks, as ``torchgraft inspect`` reads
    it without torch (every pair of chunks compared, before: over 20 CPU s)."""
    from tests.test_quick_inspect import _chunk_flood
    from torchgraft.quick_inspect import quick_inspect

    path = _chunk_flood(folder / "dcp", 4096 // SCALE)

    def read() -> object:
        info = quick_inspect(path)
        assert info is not None
        return f"{len(info.tensors)} tensors summarised"
    return read


def _claiming_config(kind: str) -> Case:
    """A tiny transformers checkpoint folder whose config.json claims sizes it does not hold,
    verified (``verify=True``)."""
    def build(folder: Path) -> Callable[[], object]:
        from tests.graft.pairs.codebases import hf_llama, hf_vit

        make, claim = (hf_llama, {"num_hidden_layers": 100_000}) if kind == "layers" else \
            (hf_vit, {"image_size": 100_000})
        make().save_pretrained(folder / "model")  # type: ignore[operator]
        config = json.loads((folder / "model" / "config.json").read_text())
        (folder / "model" / "config.json").write_text(json.dumps({**config, **claim}))
        return lambda: tg.graft(folder / "model", make(), verify=True)
    return build


def _dcp_huge_chunk(folder: Path) -> Callable[[], object]:
    from torch.distributed.checkpoint import save

    path = folder / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save({"w": torch.ones(4, 4)}, checkpoint_id=str(path))
    with (path / ".metadata").open("rb") as f:
        metadata = pickle.load(f)  # our own file, written just above
    entry = metadata.state_dict_metadata["w"]
    entry.size = torch.Size([10**6, 10**6])
    entry.chunks[0].sizes = torch.Size([10**6, 10**6])
    with (path / ".metadata").open("wb") as f:
        pickle.dump(metadata, f)
    return _opener(path)


def _quantized_stride0(dtype: torch.dtype, side: int) -> Case:
    def build(folder: Path) -> Callable[[], object]:
        values = torch.zeros(1, dtype=torch.int32 if dtype == torch.qint32 else torch.int8)
        q = torch._empty_affine_quantized([0], scale=0.5, zero_point=0, dtype=dtype)
        q.set_(values.untyped_storage(), 0, (side, side), (0, 0))
        path = folder / f"stride0-{dtype}.pt"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.save({"q": q}, path)

        def read() -> object:
            loaded = tg.load(path)["q"]
            assert loaded.shape == (side, side) and loaded.stride() == (0, 0), loaded.stride()
            assert loaded.dtype == dtype and loaded.q_scale() == 0.5
            return "a view, as torch.load gives"
        return read
    return build


def _inspect_json(body: bytes, name: str) -> Case:
    def build(folder: Path) -> Callable[[], object]:
        path = _pickle_file(folder, name, body)

        def read() -> object:
            info = tg.inspect(path).to_dict()
            return f"{len(json.dumps(info))} bytes of JSON"
        return read
    return build


def _deepspeed(change: str) -> Case:
    """A DeepSpeed ZeRO folder (deepspeed's own, re-saved) with one record lying."""
    def build(folder: Path) -> Callable[[], object]:
        from tests.io.test_deepspeed import _ZERO1_OPTIM, _edited, _frozen, _optimizer

        def count(optim: dict[str, object]) -> None:
            optim["partition_count"] = "x"

        def int64(optim: dict[str, Any]) -> None:
            key = "single_partition_of_fp32_groups"
            optim[key] = [t.long() for t in optim[key]]

        edits: dict[str, Callable[[dict[str, Any]], None]] = {
            "count": _optimizer(count), "dtype": _optimizer(int64)}
        name = "mp_rank_00_model_states.pt" if change == "frozen" else _ZERO1_OPTIM.format(0)
        edit = _frozen((10**6, 10**6), torch.ones(4)) if change == "frozen" else edits[change]
        return _opener(_edited(folder, "zero1", {name: edit}))
    return build


def _self_linked_part(folder: Path) -> Callable[[], object]:
    pipeline = folder / "ldm"
    shutil.copytree(FIXTURES / "diffusers" / "ldm", pipeline)
    shutil.rmtree(pipeline / "unet")
    (pipeline / "unet").symlink_to("unet")
    return _opener(pipeline)


def _int8_scales(folder: Path) -> Callable[[], object]:
    weight = torch.quantize_per_channel(torch.randn(64, 64), torch.rand(64, dtype=torch.float64)
                                        + 0.01, torch.zeros(64, dtype=torch.long), 0, torch.qint8)
    real = torch.Tensor.q_per_channel_scales
    torch.Tensor.q_per_channel_scales = lambda self: real(self).to(torch.int8)  # type: ignore
    try:
        torch.save({"w": weight}, folder / "q.pt")
    finally:
        torch.Tensor.q_per_channel_scales = real  # type: ignore[method-assign]
    return _opener(folder / "q.pt")


def _external_storage(folder: Path) -> Callable[[], object]:
    from tests.io.test_keras import _dense

    path = folder / "external.weights.h5"
    _dense(path, external=[("/etc/hostname", 0, 24)])
    return _opener(path)


def _mlx(change: str) -> Case:
    def build(folder: Path) -> Callable[[], object]:
        copy = folder / "mlx"
        shutil.copytree(FIXTURES / "frameworks" / "mlx" / "llama_q4", copy)
        config = json.loads((copy / "config.json").read_text())
        if change == "group_size 0":
            config["quantization"]["group_size"] = 0
            (copy / "config.json").write_text(json.dumps(config))
        else:
            (folder / "elsewhere.json").write_text(json.dumps(config))
            (copy / "config.json").unlink()
            (copy / "config.json").symlink_to(folder / "elsewhere.json")
        return _opener(copy)
    return build


def _hub(change: str) -> Case:
    def build(folder: Path) -> Callable[[], object]:
        import huggingface_hub.constants

        from tests.hub_cache import COMMIT
        from tests.io.test_contain import _hub_sharded

        snapshot, _ = _hub_sharded(folder / "hub")
        huggingface_hub.constants.HF_HUB_CACHE = str(folder / "hub")
        os.environ["HF_HUB_OFFLINE"] = "1"
        repository = snapshot.parent.parent
        (folder / "evil").mkdir()
        torch.save({}, folder / "evil" / "x.pt")
        if change == "ref":
            (repository / "refs" / "main").write_text("../../../evil")
        elif change == "fifo":
            (repository / "refs" / "main").unlink()
            os.mkfifo(repository / "refs" / "main")
        else:
            shutil.rmtree(snapshot)
            (repository / "snapshots" / COMMIT).symlink_to(folder / "evil")
        return lambda: tg.load("org/name")
    return build


def _orbax_fifo(folder: Path) -> Callable[[], object]:
    copy = folder / "attention"
    shutil.copytree(FIXTURES / "frameworks" / "orbax" / "attention", copy)
    (copy / "params.head.bias" / "0").unlink()
    os.mkfifo(copy / "params.head.bias" / "0")
    return _opener(copy)


def _walk(kind: str, count: int) -> Case:
    """A structure of ``count`` items (divided by :data:`SCALE`) whose walk was quadratic."""
    count //= SCALE

    def build(folder: Path) -> Callable[[], object]:
        if kind == "onnx":
            from tests.io.test_onnx import _identity_chain

            path = folder / "chain.onnx"
            _identity_chain(path, count)
        elif kind == "flax":
            from tests.io.test_flax import _many_modules, _to_bytes

            path = folder / "many.msgpack"
            path.write_bytes(_to_bytes(_many_modules(count)))
        else:
            from tests.io.test_dcp import _row_chunks

            path = folder / "dcp"
            _row_chunks(path, count, stored=False)

        def read() -> object:
            with tg.open(path) as ckpt:
                return f"{len(ckpt.keys())} tensors opened"
        return read
    return build


def _rules(name: str, text: str) -> Case:
    def build(folder: Path) -> Callable[[], object]:
        from torchgraft.graft.layouts.rules import read_rules

        (folder / name).write_text(text)
        return lambda: read_rules(folder / name)
    return build


#: Nine levels of nine aliases each: 9^9 (387 million) strings once expanded, in 340 bytes.
ALIAS_BOMB = "rules:\n" + "".join(
    f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9) if i else 'lol'}]\n" for i in range(9))


def _backtracking_rule(folder: Path) -> Callable[[], object]:
    from torch import nn

    torch.save({"0.weight": torch.ones(2, 2), "0.bias": torch.ones(2),
                "a" * 40 + "!": torch.ones(1)}, folder / "keys.pt")
    return lambda: tg.graft(folder / "keys.pt", nn.Sequential(nn.Linear(2, 2)),
                            rules=[[r"^(\w+\.?)*$", "x"]])


def _deep_key_page(folder: Path) -> Callable[[], object]:
    from torch import nn

    torch.save({"0.weight": torch.ones(2, 2), "0.bias": torch.ones(2),
                ".".join(["part"] * 3000): torch.ones(1)}, folder / "deep.pt")

    def read() -> object:
        report = tg.graft(folder / "deep.pt", nn.Sequential(nn.Linear(2, 2)))
        return f"{report.to_html(folder / 'report.html').stat().st_size} bytes of HTML"
    return read


def _ranks(folder: Path) -> Callable[[], object]:
    torch.save({"w": torch.ones(2)}, folder / "w.pt")
    return lambda: tg.convert(folder / "w.pt", folder / "dcp", format="dcp", ranks=2**31)


CASES: dict[str, Case] = {
    "paddle BINUNICODE 4 GiB": lambda d: _opener(_pickle_file(d, "a.pdparams", _BINUNICODE_4G)),
    "paddle FRAME 2^40": lambda d: _opener(_pickle_file(d, "b.pdparams", _FRAME_2_40)),
    "paddle BINBYTES8 2^62": lambda d: _opener(_pickle_file(d, "c.pdparams", _BINBYTES8_2_62)),
    "paddle BYTEARRAY8 2^40": lambda d: _opener(_pickle_file(d, "d.pdparams",
                                                             _BYTEARRAY8_2_40)),
    "legacy torch BINUNICODE 4 GiB": lambda d: _opener(
        _pickle_file(d, "a.pth", _BINUNICODE_4G, legacy=True)),
    "legacy torch FRAME 2^40": lambda d: _opener(_pickle_file(d, "b.pth", _FRAME_2_40,
                                                              legacy=True)),
    "legacy torch BINBYTES8 2^62": lambda d: _opener(
        _pickle_file(d, "c.pth", _BINBYTES8_2_62, legacy=True)),
    "paddle numpy.ndarray((2**33,))": lambda d: _opener(
        _pickle_file(d, "e.pdparams", pickle.dumps({"w": _Ndarray()}, protocol=2))),
    "DCP chunk 10^6 x 10^6": _dcp_huge_chunk,
    "DCP 4 tensors of 4,096 one-element chunks (inspect without torch)": _quick_chunk_flood,
    "torch zip local header claiming a 65,535-byte name (convert)": _zip_name_length,
    "config.json num_hidden_layers 100,000 beside 2 layers (verify)": _claiming_config("layers"),
    "config.json image_size 10^5 (verify)": _claiming_config("image"),
    "qint8 1 byte as 2^15 x 2^15, stride 0": _quantized_stride0(torch.qint8, 1 << 15),
    "qint32 4 bytes as 2^16 x 2^16, stride 0": _quantized_stride0(torch.qint32, 1 << 16),
    "100k distinct unknown globals": _inspect_json(_distinct_globals(100_000 // SCALE), "g.pkl"),
    "one global called 1M times": _inspect_json(_repeated_call(1_000_000), "h.pkl"),
    "quick inspect: DCP .metadata memo index 2^27": _quick_memo_bomb,
    "inspect --json of a 1M-argument call": _inspect_json(_wide_call(1_000_000 // SCALE),
                                                          "i.pkl"),
    "DeepSpeed partition_count 'x'": _deepspeed("count"),
    "DeepSpeed frozen 10^6 x 10^6 from 4 elements": _deepspeed("frozen"),
    "DeepSpeed fp32 partitions stored as int64": _deepspeed("dtype"),
    "pipeline part folder linking to itself": _self_linked_part,
    "qint8 per-channel scales stored as int8": _int8_scales,
    "unknown calls nested 100,000 deep": lambda d: _opener(_pickle_file(
        d, "calls.pkl", b"\x80\x02cfoo\nf\nq\x00" + b"h\x00" * 99_999 + b")"
        + b"R\x85" * 99_999 + b"R.")),
    "HDF5 external storage naming /etc/hostname": _external_storage,
    "MLX config.json linking out": _mlx("link"),
    "MLX group_size 0": _mlx("group_size 0"),
    "Hub refs/main naming ../../../evil": _hub("ref"),
    "Hub refs/main a FIFO": _hub("fifo"),
    "Hub snapshot linking out": _hub("snapshot"),
    "Orbax chunk a FIFO": _orbax_fifo,
    "ONNX 16,000 Identity chains (1.1 MB)": _walk("onnx", 16_000),
    "Flax 4,000 modules with stack-like biases": _walk("flax", 4000),
    "DCP 16,000 chunks": _walk("dcp", 16_000),
    "convert ranks=2**31": _ranks,
    "rules file: YAML alias bomb (9^9 strings)": _rules("bomb.yaml", ALIAS_BOMB),
    "rules file: JSON nested 100,000 deep": _rules("deep.json", "[" * 100_000 + "]" * 100_000),
    "rules file: reshape to [-1, -4]": _rules("reshape.json", json.dumps(
        [{"op": "reshape", "from": "w", "shape": [-1, -4]}])),
    "user regex backtracking over a 41-character key": _backtracking_rule,
    "HTML report of a key of 3,000 dotted parts": _deep_key_page,
}
#: What reading a case ends in: the error's class, or ``None`` (it reads, bounded); every case
#: not named here ends in a CorruptCheckpointError.
OUTCOMES: dict[str, str | None] = {
    "qint8 1 byte as 2^15 x 2^15, stride 0": None,
    "qint32 4 bytes as 2^16 x 2^16, stride 0": None,
    "100k distinct unknown globals": None,
    "inspect --json of a 1M-argument call": None,
    "DCP 4 tensors of 4,096 one-element chunks (inspect without torch)": None,
    "config.json num_hidden_layers 100,000 beside 2 layers (verify)": "TorchgraftError",
    "config.json image_size 10^5 (verify)": "TorchgraftError",
    "HDF5 external storage naming /etc/hostname": "UnsupportedCheckpointError",
    "MLX config.json linking out": "OutsideCheckpointError",
    "Hub refs/main a FIFO": "UnsupportedCheckpointError",
    "Hub snapshot linking out": "OutsideCheckpointError",
    "Orbax chunk a FIFO": "UnsupportedCheckpointError",
    "ONNX 16,000 Identity chains (1.1 MB)": None,
    "Flax 4,000 modules with stack-like biases": None,
    "DCP 16,000 chunks": None,
    "convert ranks=2**31": "TorchgraftError",
    "rules file: YAML alias bomb (9^9 strings)": "TorchgraftError",
    "rules file: JSON nested 100,000 deep": "TorchgraftError",
    "rules file: reshape to [-1, -4]": "TorchgraftError",
    "user regex backtracking over a 41-character key": "TorchgraftError",
    "HTML report of a key of 3,000 dotted parts": None,
}


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def measure(folder: Path) -> list[dict[str, object]]:
    """Build and read every case; one record per case."""
    results = []
    for name, build in CASES.items():
        case_folder = folder / str(len(results))
        case_folder.mkdir(parents=True)
        read = build(case_folder)
        size = sum(p.stat().st_size for p in case_folder.rglob("*") if p.is_file())
        Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
        baseline = _status("VmRSS")
        start = time.process_time()
        try:
            outcome: object = read()
            error = None
        except tg.TorchgraftError as exc:
            outcome, error = str(exc)[:160], type(exc).__name__
        except Exception as exc:  # a raw exception: recorded, and the test fails on it
            outcome, error = f"RAW {type(exc).__name__}: {str(exc)[:140]}", "RAW"
        cpu = time.process_time() - start
        peak = _status("VmHWM") - baseline
        results.append({"case": name, "cpu_s": round(cpu, 3), "peak_mib": round(peak / 2**20, 1),
                        "file_bytes": size, "error": error, "outcome": str(outcome)})
        shutil.rmtree(case_folder)
    return results


if __name__ == "__main__":
    _, limit = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_status("VmSize") + (3 << 30), limit))
    for record in measure(Path(sys.argv[1])):
        print(json.dumps(record), flush=True)
