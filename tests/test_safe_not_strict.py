"""Files from Lightning, mmengine, DeepSpeed and newer Pythons open without unsafe=True.

Calls of unknown globals are recorded, not run, and listed in ``skipped_calls``; only known
code-execution primitives are refused. Resolving a name never imports a module.
"""

from __future__ import annotations

import enum
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchgraft as tg


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class ZeroStageEnum(enum.IntEnum):
    weights = 3


class HistoryBuffer:
    @classmethod
    def min(cls) -> None:
        return None


def test_enum_in_hyper_parameters_opens_and_is_listed(tmp_path: Path) -> None:
    path = tmp_path / "lightning.ckpt"
    torch.save({"state_dict": {"layer.weight": torch.ones(2, 2)},
                "hyper_parameters": {"color": Color.GREEN, "lr": 0.1},
                "ds_config": {"stage": ZeroStageEnum.weights}}, path)
    with tg.open(path) as ckpt:
        assert torch.equal(ckpt.get("layer.weight"), torch.ones(2, 2))
        assert ckpt.skipped_calls == [f"{__name__}.Color", f"{__name__}.ZeroStageEnum"]
        assert ckpt.extras["hyper_parameters"]["lr"] == 0.1
    info = tg.inspect(path)
    assert info.to_dict()["skipped_calls"] == [f"{__name__}.Color", f"{__name__}.ZeroStageEnum"]


def test_getattr_on_an_unknown_class_opens(tmp_path: Path) -> None:
    path = tmp_path / "mmengine.pth"
    torch.save({"state_dict": {"w": torch.zeros(3)},
                "message_hub": {"reduce": HistoryBuffer.min}}, path)
    with tg.open(path) as ckpt:
        assert ckpt.keys() == ["w"]


def test_getattr_on_a_real_object_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "attack.pkl"
    # getattr(collections.OrderedDict, "fromkeys") would reach a real callable.
    path.write_bytes(b"cbuiltins\ngetattr\n(ccollections\nOrderedDict\nS'fromkeys'\ntR.")
    try:
        tg.load(path)
    except tg.UnsafeCheckpointError as exc:
        assert "getattr" in str(exc)
    else:
        raise AssertionError("getattr on a real object was not refused")


def test_python_313_pathlib_names_open(tmp_path: Path) -> None:
    path = tmp_path / "py313.pkl"
    # What Python 3.13 writes for pathlib.PosixPath('/data/run1') under protocol 2.
    path.write_bytes(b"\x80\x02}q\x00(X\x01\x00\x00\x00wq\x01cnumpy.core.multiarray\n_reconstruct"
                     b"\nq\x02cnumpy\nndarray\nK\x00\x85C\x01bq\x03\x87R(K\x01K\x01\x85cnumpy\n"
                     b"dtype\nX\x02\x00\x00\x00f4K\x00K\x01\x87R(K\x03X\x01\x00\x00\x00<NNNJ\xff"
                     b"\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89C\x04\x00\x00\x80?tbX\x03\x00\x00"
                     b"\x00dircpathlib._local\nPosixPath\nX\n\x00\x00\x00/data/run1\x85Ru.")
    with tg.open(path) as ckpt:
        assert ckpt.extras["dir"] == "/data/run1"
        assert torch.equal(ckpt.get("w"), torch.ones(1))
        assert not ckpt.skipped_calls


@pytest.mark.slow
def test_opening_a_file_imports_nothing(tmp_path: Path) -> None:
    path = tmp_path / "layout.pt"
    torch.save({"w": torch.ones(1)}, path)
    crafted = tmp_path / "inductor.pkl"
    crafted.write_bytes(b"ctorch.serialization\n_get_layout\n(S'_inductor'\ntR.")
    code = ("import sys, torchgraft as tg\n"
            f"tg.open({str(path)!r}).close()\n"
            f"tg.load({str(path)!r})\n"
            "before = set(sys.modules)\n"
            f"try:\n    tg.load({str(crafted)!r})\nexcept tg.TorchgraftError:\n    pass\n"
            "new = sorted(set(sys.modules) - before)\n"
            "print(new)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout[:500]
