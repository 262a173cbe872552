"""Keras 3 (.keras, .weights.h5), tf.keras legacy .h5 and transformers' tf_model.h5, written by
TensorFlow/Keras themselves (scripts/make_framework_fixtures.py), grafted into PyTorch twins."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.helpers import BOUNDED, calls
from tests.io.framework_twins import AttentionTwin, assert_bert_grafts
from torchgraft.bounds import MAX_NESTING
from torchgraft.errors import CorruptCheckpointError, TorchgraftError, UnsupportedCheckpointError

h5py = pytest.importorskip("h5py")
FIXTURES = Path(__file__).parent.parent / "fixtures" / "frameworks" / "keras"


class KerasCNN(nn.Module):
    """The Keras CNN (Conv2D, BatchNormalization, DepthwiseConv2D, Dense, LayerNormalization)."""

    def __init__(self, width: int = 6) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, eps=1e-3), nn.ReLU(),
                                      nn.Conv2d(4, 4, 3, padding=1, groups=4))
        self.fc = nn.Linear(4, width)
        self.norm = nn.LayerNorm(width, eps=1e-3)
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.features(x.permute(0, 3, 1, 2)).mean((2, 3))
        return self.head(self.norm(self.fc(y)))


def KerasAttention() -> AttentionTwin:
    """Embedding, Keras MultiHeadAttention(num_heads=2, key_dim=4) and a Dense."""
    return AttentionTwin(names=("query", "key", "value", "attention_output"), head="out")


class LegacyNet(nn.Module):
    """tf.keras Sequential: Conv2D, BatchNormalization, Flatten (channels last), Dense."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4, eps=1e-3)
        self.fc = nn.Linear(144, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x.permute(0, 3, 1, 2)))
        return self.fc(y.permute(0, 2, 3, 1).flatten(1))


def _check(path: Path, model: nn.Module, io_name: str, key: str = "x") -> None:
    io = np.load(FIXTURES / io_name)
    report = tg.graft(path, model.eval())
    assert report.ok, report
    with torch.no_grad():
        out = model(torch.from_numpy(io[key]).long() if key == "ids" else
                     torch.from_numpy(io[key]))
    np.testing.assert_allclose(out.numpy(), io["y"], rtol=1e-5, atol=1e-5)


def test_keras3_archive_grafts_into_a_pytorch_twin() -> None:
    _check(FIXTURES / "cnn.keras", KerasCNN(), "cnn_io.npz")


def test_keras3_attention_kernels_are_relaid() -> None:
    _check(FIXTURES / "attention.keras", KerasAttention(), "attention_io.npz", key="ids")


def test_keras3_weights_h5_under_the_same_names() -> None:
    with tg.open(FIXTURES / "cnn.weights.h5") as ckpt:
        assert ckpt.format == "keras"
        assert ckpt.meta("stem.weight").shape == (4, 3, 3, 3)  # HWIO re-laid as OIHW
        assert ckpt.meta("dw.weight").shape == (4, 1, 3, 3)
        assert ckpt.meta("fc.weight").shape == (6, 4)  # [in, out] transposed
        assert "stem_bn.running_var" in ckpt


def test_legacy_tf_keras_h5_grafts() -> None:
    _check(FIXTURES / "legacy.h5", LegacyNet(), "legacy_io.npz")


def test_legacy_whole_model_h5_grafts_and_its_architecture_is_not_run() -> None:
    _check(FIXTURES / "legacy_full.h5", LegacyNet(), "legacy_full_io.npz")


def test_transformers_tf_model_h5_grafts_into_bert() -> None:
    assert_bert_grafts(FIXTURES / "tf_bert" / "tf_model.h5", FIXTURES / "tf_bert_io.npz")


def test_other_widths_or_head_counts_are_never_ok() -> None:
    assert not tg.graft(FIXTURES / "cnn.keras", KerasCNN(width=7), strict=False).ok
    four_heads = AttentionTwin(names=("query", "key", "value", "attention_output"), head="out",
                               heads=4)
    assert not tg.graft(FIXTURES / "attention.keras", four_heads, strict=False).ok


def test_interchangeable_projections_are_a_guess_until_outputs_settle_it() -> None:
    """Four same-shaped projections under names that say nothing of their roles: UNVERIFIED,
    never ok, until the outputs Keras gave (committed beside the file) are reproduced."""
    model = AttentionTwin(names=("p1", "p2", "p3", "p4"), head="out").eval()
    report = tg.graft(FIXTURES / "attention.keras", model, strict=False)
    assert report.verdict == "unverified" and not report.ok
    io = np.load(FIXTURES / "attention_io.npz")
    with torch.no_grad():
        out = model(torch.from_numpy(io["ids"]).long())
    np.testing.assert_allclose(out.numpy(), io["y"], rtol=1e-5, atol=1e-5)
    report.mark_verified()
    assert report.ok


def test_inspect_states_the_head_size() -> None:
    metadata = tg.inspect(FIXTURES / "attention.keras").extras["__metadata__"]
    assert metadata["head_dims"] == {"attn": 4}


def test_inspect_and_convert(tmp_path: Path) -> None:
    info = tg.inspect(FIXTURES / "cnn.keras")
    assert info.format == "keras"
    assert info.extras["__metadata__"]["framework"] == "keras 3"
    assert tg.inspect(FIXTURES / "legacy.h5").extras["__metadata__"]["framework"].startswith(
        "tf.keras")
    out = tmp_path / "cnn.safetensors"
    tg.convert(FIXTURES / "cnn.keras", out)
    model = KerasCNN()
    assert tg.graft(out, model).ok
    io = np.load(FIXTURES / "cnn_io.npz")
    with torch.no_grad():
        np.testing.assert_allclose(model.eval()(torch.from_numpy(io["x"])).numpy(), io["y"],
                                   rtol=1e-5, atol=1e-5)


def test_nesting_bomb_is_an_error_in_bounded_time(tmp_path: Path) -> None:
    path = tmp_path / "deep.weights.h5"
    with h5py.File(path, "w") as f:
        group = f.create_group("layers")
        for i in range(MAX_NESTING + 5):
            group = group.create_group(f"g{i}")
            group.create_group("vars").create_dataset("0", data=np.zeros(2, np.float32))
    def refused() -> None:
        with pytest.raises(CorruptCheckpointError, match="deep"):
            tg.open(path)

    assert calls(refused) < BOUNDED


def test_a_dataset_claiming_2_to_the_40_elements_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "huge.weights.h5"
    with h5py.File(path, "w") as f:
        variables = f.create_group("layers").create_group("dense").create_group("vars")
        variables.create_dataset("0", shape=(2**20, 2**20), dtype=np.float32, chunks=(1, 16),
                                 compression="gzip")
    with pytest.raises(CorruptCheckpointError, match="more than the file can hold"):
        tg.open(path)


def test_truncated_files_are_errors(tmp_path: Path) -> None:
    for name in ("cnn.keras", "legacy.h5"):
        data = (FIXTURES / name).read_bytes()
        path = tmp_path / name
        path.write_bytes(data[:len(data) - 4000])
        with pytest.raises(TorchgraftError):
            tg.load(path)


def _dense(path: Path, **storage: object) -> np.ndarray:
    """A Keras 3 weights file of one Dense layer, written by h5py; its kernel stored as asked."""
    kernel = np.arange(6, dtype=np.float32).reshape(2, 3)
    with h5py.File(path, "w") as f:
        variables = f.create_group("layers").create_group("dense").create_group("vars")
        if storage:
            variables.create_dataset("0", shape=kernel.shape, dtype=kernel.dtype, **storage)
        else:
            variables.create_dataset("0", data=kernel)
    return kernel


def test_hdf5_external_storage_is_refused_never_read(tmp_path: Path) -> None:
    control = tmp_path / "own.weights.h5"
    kernel = _dense(control)
    assert torch.equal(tg.load(control)["dense.weight"], torch.from_numpy(kernel.T.copy()))
    secret = tmp_path / "secret.bin"
    secret.write_bytes(kernel.tobytes())  # what h5py would read: another file's bytes
    path = tmp_path / "external.weights.h5"
    _dense(path, external=[(str(secret), 0, kernel.nbytes)])
    with h5py.File(path, "r") as f:  # the file really points there, and h5py reads it
        assert f["layers/dense/vars/0"].external
        assert np.array_equal(f["layers/dense/vars/0"][()], kernel)
    with pytest.raises(UnsupportedCheckpointError, match="HDF5 external storage"):
        tg.open(path)
    with pytest.raises(UnsupportedCheckpointError, match="another file"):
        tg.load(path)


def test_a_virtual_dataset_or_an_external_link_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.h5"
    kernel = np.ones((2, 3), np.float32)
    with h5py.File(other, "w") as f:
        f.create_dataset("kernel", data=kernel)
    virtual = tmp_path / "virtual.weights.h5"
    layout = h5py.VirtualLayout(shape=(2, 3), dtype=np.float32)
    layout[:] = h5py.VirtualSource(str(other), "kernel", shape=(2, 3))
    with h5py.File(virtual, "w") as f:
        f.create_group("layers/dense/vars").create_virtual_dataset("0", layout)
    with pytest.raises(UnsupportedCheckpointError, match="virtual dataset"):
        tg.open(virtual)
    linked = tmp_path / "linked.weights.h5"
    with h5py.File(linked, "w") as f:
        f.create_group("layers/dense")["vars"] = h5py.ExternalLink(str(other), "/")
    with pytest.raises(UnsupportedCheckpointError, match="link into another file"):
        tg.open(linked)
