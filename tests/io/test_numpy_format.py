"""NumPy .npy and .npz files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import torchgraft as tg
from tests.helpers import assert_same_state


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((4, 5)).astype(np.float32),
        "fortran": np.asfortranarray(rng.standard_normal((3, 4))),
        "big_endian": rng.standard_normal(6).astype(">f4"),
        "ints": np.arange(7, dtype=np.int16),
        "flags": np.array([True, False]),
        "scalar": np.array(1.5, dtype=np.float16),
    }


def _expected(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v.astype(v.dtype.newbyteorder("="), order="C"))
            for k, v in arrays.items()}


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz(tmp_path: Path, save: object) -> None:
    arrays = _arrays()
    path = tmp_path / "weights.npz"
    save(path, **arrays)  # type: ignore[operator]
    with tg.open(path) as ckpt:
        assert ckpt.format == "numpy"
        assert ckpt.meta("big_endian").dtype == torch.float32
    assert_same_state(tg.load(path), _expected(arrays))


def test_npy(tmp_path: Path) -> None:
    for name, array in _arrays().items():
        path = tmp_path / f"{name}.npy"
        np.save(path, array)
        assert_same_state(tg.load(path), _expected({name: array}))


def test_npy_without_torch_dtype(tmp_path: Path) -> None:
    path = tmp_path / "text.npy"
    np.save(path, np.array(["a", "b"]))
    with pytest.raises(tg.UnsupportedCheckpointError, match="torch lacks"):
        tg.open(path)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_of_every_header_version(tmp_path: Path, version: tuple[int, int]) -> None:
    array = _arrays()["w"]
    path = tmp_path / "w.npy"
    with path.open("wb") as f:
        np.lib.format.write_array(f, array, version=version)
    assert_same_state(tg.load(path), _expected({"w": array}))


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_a_header_length_past_what_numpy_reads_is_refused_before_it_is_read(
        tmp_path: Path, version: tuple[int, int]) -> None:
    """A 2.0 header may state 4 GiB of header: numpy would read that many bytes first."""
    path = tmp_path / "w.npy"
    with path.open("wb") as f:
        np.lib.format.write_array(f, _arrays()["w"], version=version)
    raw = bytearray(path.read_bytes())
    width = 2 if version == (1, 0) else 4
    raw[8:8 + width] = (2**(8 * width) - 1).to_bytes(width, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(tg.CorruptCheckpointError, match="malformed header.*header length"):
        tg.open(path)
