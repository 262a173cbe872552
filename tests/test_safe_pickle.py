"""Opening a file never runs code from it; unsafe=True is the explicit opt-in."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import torchgraft as tg
from tests.helpers import Payload


def _write(kind: str, path: Path, marker: Path, protocol: int = 2) -> Path:
    if kind == "torch-zip":
        torch.save({"w": torch.ones(2), "hook": Payload(marker)}, path)
    elif kind == "torch-legacy":
        torch.save({"w": torch.ones(2), "hook": Payload(marker)}, path,
                   _use_new_zipfile_serialization=False)
    elif kind == "whole-model-attr":
        model = torch.nn.Linear(2, 2)
        model.hook = Payload(marker)  # type: ignore[assignment]
        torch.save(model, path)
    else:
        with path.open("wb") as f:
            pickle.dump({"w": np.ones(2, np.float32), "hook": Payload(marker)}, f,
                        protocol=protocol)
    return path


@pytest.mark.parametrize(("kind", "name", "protocol"), [
    ("torch-zip", "a.pt", 2),
    ("torch-legacy", "a.pth", 2),
    ("whole-model-attr", "a.pt", 2),
    ("paddle", "a.pdparams", 2),
    ("paddle", "a.pdparams", 4),
    ("pickle", "a.pkl", 0),
    ("pickle", "a.pkl", 1),
    ("pickle", "a.pkl", 3),
    ("pickle", "a.pkl", 5),
])
def test_payload_is_refused_and_never_runs(tmp_path: Path, kind: str, name: str,
                                           protocol: int) -> None:
    marker = tmp_path / "PWNED"
    path = _write(kind, tmp_path / name, marker, protocol)
    for call in (tg.open, tg.load, tg.inspect):
        with pytest.raises(tg.UnsafeCheckpointError) as info:
            call(path)
        assert "os.system" in str(info.value)
        assert "unsafe=True" in str(info.value)
        assert str(path) in str(info.value)
    assert not marker.exists()


# Hand-written pickles that call through other opcodes: INST (protocol 0), OBJ (protocol 1),
# a tensor-subclass rebuild whose "function" is os.system, and builtins that run code.
_CRAFTED = {
    "inst": b"(S'touch {m}'\nios\nsystem\n.",
    "obj": b"(cos\nsystem\nS'touch {m}'\no.",
    "eval": b"cbuiltins\neval\n(S'__import__(\"os\").system(\"touch {m}\")'\ntR.",
    "getattr": (b"cbuiltins\ngetattr\n(cbuiltins\n__import__\n(S'os'\ntRS'system'\ntR"
                b"(S'touch {m}'\ntR."),
    "subclass-rebuild": b"ctorch._tensor\n_rebuild_from_type_v2\n(cos\nsystem\nNS'touch {m}'\n"
                        b"\x85NtR.",
    "subprocess": b"csubprocess\ncall\n((S'touch'\nS'{m}'\nltR.",
}


@pytest.mark.parametrize("name", sorted(_CRAFTED))
def test_crafted_opcodes_are_refused(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "crafted.pkl"
    path.write_bytes(_CRAFTED[name].replace(b"{m}", str(marker).encode()))
    with pytest.raises(tg.UnsafeCheckpointError):
        tg.load(path)
    assert not marker.exists()


def test_object_arrays_in_npy_are_refused_without_unpickling(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "objects.npy"
    array = np.empty(1, dtype=object)
    array[0] = Payload(marker)
    np.save(path, array, allow_pickle=True)
    with pytest.raises(tg.UnsupportedCheckpointError, match="Python objects"):
        tg.load(path)
    assert not marker.exists()


def test_unsafe_true_is_the_explicit_opt_in(tmp_path: Path) -> None:
    marker = tmp_path / "RAN"
    path = _write("torch-zip", tmp_path / "trusted.pt", marker)
    with tg.open(path, unsafe=True) as ckpt:
        assert ckpt.keys() == ["w"]
        assert torch.equal(ckpt.get("w"), torch.ones(2))
    assert marker.exists()


def test_unknown_classes_are_built_inertly_and_named_in_extras(tmp_path: Path) -> None:
    import argparse

    args = argparse.Namespace(lr=0.1, arch="resnet18")
    path = tmp_path / "ckpt.pt"
    torch.save({"args": args, "state_dict": {"w": torch.ones(1)}}, path)
    with tg.open(path) as ckpt:
        assert ckpt.extras["args"] == {"__class__": "argparse.Namespace", "lr": 0.1,
                                       "arch": "resnet18"}


def test_dcp_metadata_and_bytes_entries_are_refused(tmp_path: Path) -> None:
    import warnings

    from torch.distributed.checkpoint.state_dict_saver import save

    marker = tmp_path / "PWNED"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save({"model": {"w": torch.ones(2)}, "hook": Payload(marker)},
             checkpoint_id=str(tmp_path / "entry"))
        save({"model": {"w": torch.ones(2)}}, checkpoint_id=str(tmp_path / "meta"))
    assert not marker.exists()
    metadata_path = tmp_path / "meta" / ".metadata"
    with metadata_path.open("rb") as f:
        metadata = pickle.load(f)
    metadata.planner_data = Payload(marker)
    with metadata_path.open("wb") as f:
        pickle.dump(metadata, f)
    for directory in ("entry", "meta"):
        with pytest.raises(tg.UnsafeCheckpointError, match="os.system"):
            tg.open(tmp_path / directory)
    assert not marker.exists()


class Called:
    """Pickled as a call of this (unknown, when read) global with its inner value."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __reduce__(self) -> tuple[object, tuple[object]]:
        return Called, (self.inner,)


class Built:
    """Pickled as an object of an unknown class whose state holds the next one."""

    def __init__(self, inner: object) -> None:
        self.inner = inner


def _chain(kind: type, depth: int) -> object:
    value: object = torch.ones(1)
    for _ in range(depth):
        value = kind(value)
    return value


@pytest.mark.parametrize("kind", [Called, Built])
def test_unknown_calls_and_objects_nesting_past_the_bound_are_refused(tmp_path: Path,
                                                                      kind: type) -> None:
    from torchgraft.bounds import MAX_NESTING

    path = tmp_path / "nested.pt"
    torch.save({"w": torch.ones(1), "chain": _chain(kind, MAX_NESTING // 3)}, path)
    with tg.open(path) as ckpt:  # the control: nested, well inside the bound
        assert torch.equal(ckpt.get("w"), torch.ones(1))
    torch.save({"w": torch.ones(1), "chain": _chain(kind, MAX_NESTING + 1)}, path)
    with pytest.raises(tg.CorruptCheckpointError, match=f"nest deeper than {MAX_NESTING}"):
        tg.open(path)


def _nested_calls(depth: int) -> bytes:
    """``f(f(f(...())))`` ``depth`` deep: 3 bytes a level, no recursion to build or read."""
    return (b"\x80\x02cfoo\nf\nq\x00" + b"h\x00" * (depth - 1) + b")"
            + b"R\x85" * (depth - 1) + b"R.")


def test_unknown_calls_nested_100000_deep_are_refused_in_bounded_time(tmp_path: Path) -> None:
    import time

    path = tmp_path / "calls.pkl"
    path.write_bytes(_nested_calls(50))
    with tg.open(path) as ckpt:  # the control
        assert ckpt.skipped_calls == ["foo.f"]
    path.write_bytes(_nested_calls(100_000))  # a shared record past the budget, before
    start = time.process_time()
    with pytest.raises(tg.CorruptCheckpointError, match="calls of unknown globals nest deeper"):
        tg.open(path)
    assert time.process_time() - start < 2


def _flood(calls: int, *, nested: bool) -> bytes:
    """A pickle of ``calls`` calls of one unknown global ``m.C``: flat (``C(1)``, 6 bytes
    each), or nested two deep (``C(C(1))``: the outer call's argument a record)."""
    call = b"h\x00h\x00K\x01\x85R\x85R" if nested else b"h\x00K\x01\x85R"
    return b"\x80\x02cm\nC\nq\x00(" + call * (calls // (2 if nested else 1)) + b"l."


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_unknown_call_floods_cost_linear_work_up_to_the_bound(tmp_path: Path,
                                                              nested: bool) -> None:
    """What ``inspect`` does with a flood (open, summary, JSON), counted in operations."""
    import json

    from tests.helpers import assert_operations_scale_linearly, operations

    def inspected(calls: int) -> int:
        path = tmp_path / f"flood{calls}.pkl"
        path.write_bytes(_flood(calls, nested=nested))
        return operations(lambda: json.dumps(tg.inspect(path).to_dict()))

    assert_operations_scale_linearly(inspected, 1000)
    with tg.open(tmp_path / "flood4000.pkl") as ckpt:  # the control: recorded, listed
        assert ckpt.skipped_calls == ["m.C"]


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_unknown_call_floods_past_the_bound_are_refused_in_the_same_work(
        tmp_path: Path, nested: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the bound (lowered here, so that the counting is quick) a flood of any size up
    to 10 million calls is refused at the first call past it: the same work for each."""
    from tests.helpers import operations
    from torchgraft import safe_pickle

    monkeypatch.setattr(safe_pickle, "MAX_UNKNOWN_CALLS", 1000)
    path = tmp_path / "flood.pkl"
    counted = []
    for calls in (1000, 10_000, 1_000_000, 10_000_000):
        path.write_bytes(_flood(calls, nested=nested))

        def refused() -> None:
            with pytest.raises(tg.CorruptCheckpointError, match="more than 1,000 calls of "
                                                                "globals torchgraft does not know"):
                tg.open(path)

        if calls == 1000:  # the control: at the bound, it opens
            assert tg.open(path).skipped_calls == ["m.C"]
            continue
        refused()  # what is done once per process (imports) is not counted
        counted.append(operations(refused))
    assert max(counted) <= 1.05 * min(counted), counted


def test_a_flood_past_the_bound_is_refused_naming_the_count(tmp_path: Path) -> None:
    from torchgraft.safe_pickle import MAX_UNKNOWN_CALLS

    path = tmp_path / "flood.pkl"
    path.write_bytes(_flood(1_000_000, nested=False))
    with pytest.raises(tg.CorruptCheckpointError) as caught:
        tg.inspect(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and f"more than {MAX_UNKNOWN_CALLS:,} calls" in message
    assert f"call {MAX_UNKNOWN_CALLS + 1:,}: 'm.C'" in message and "unsafe=True" in message
