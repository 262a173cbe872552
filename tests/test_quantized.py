"""Quantized checkpoints (qint8, quint8, qint32; per tensor, per channel) read as torch does.

A dynamically quantized model's checkpoint grafts into the float model, dequantized and said
so, and into the same quantized model as load_state_dict loads it; formats without quantized
dtypes refuse them with the fix.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import torchgraft as tg
from torchgraft.errors import CorruptCheckpointError, UnsupportedCheckpointError
from torchgraft.meta import TensorMeta, TensorRef
from torchgraft.quantized import quantized_ref

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def _float_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))


def _quantize(model: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def _assert_same_quantized(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.qscheme() == expected.qscheme()
    assert torch.equal(actual.int_repr(), expected.int_repr())
    if expected.qscheme() == torch.per_tensor_affine:
        assert (actual.q_scale(), actual.q_zero_point()) == (expected.q_scale(),
                                                             expected.q_zero_point())
    else:
        assert torch.equal(actual.q_per_channel_scales(), expected.q_per_channel_scales())
        assert torch.equal(actual.q_per_channel_zero_points(),
                           expected.q_per_channel_zero_points())
        assert actual.q_per_channel_axis() == expected.q_per_channel_axis()


@pytest.fixture
def quantized_file(tmp_path: Path) -> tuple[Path, nn.Module]:
    model = _quantize(_float_model())
    path = tmp_path / "dynamic.pt"
    torch.save(model.state_dict(), path)
    return path, model


def test_every_quantized_kind_loads_as_torch_loads_it(tmp_path: Path) -> None:
    w = torch.randn(4, 6)
    saved = {
        "per_tensor_qint8": torch.quantize_per_tensor(w, 0.05, 3, torch.qint8),
        "per_tensor_quint8": torch.quantize_per_tensor(w, 0.1, 128, torch.quint8),
        "per_tensor_qint32": torch.quantize_per_tensor(w, 0.001, 0, torch.qint32),
        "per_channel": torch.quantize_per_channel(w, torch.rand(4, dtype=torch.float64) + 0.01,
                                                  torch.arange(4), 0, torch.qint8),
        "per_channel_axis1": torch.quantize_per_channel(w, torch.rand(6, dtype=torch.float64)
                                                        + 0.01, torch.zeros(6, dtype=torch.long),
                                                        1, torch.quint8),
        "float_qparams": torch._make_per_channel_quantized_tensor(
            torch.randint(0, 255, (4, 6), dtype=torch.uint8), torch.rand(4) + 0.1,
            torch.rand(4), 0),
        "strided": torch.quantize_per_tensor(w, 0.05, 0, torch.qint8).t(),
    }
    path = tmp_path / "q.pt"
    torch.save(saved, path)
    expected = torch.load(path, weights_only=True)
    loaded = tg.load(path)
    assert list(loaded) == list(saved)
    for key, tensor in expected.items():
        _assert_same_quantized(loaded[key], tensor)
    info = tg.inspect(path)
    assert info.by_dtype["qint8"].tensors == 3


def test_dynamic_quantization_checkpoint_loads_packed_weights(
        quantized_file: tuple[Path, nn.Module]) -> None:
    path, model = quantized_file
    with tg.open(path) as ckpt:
        assert "0._packed_params._packed_params.0" in ckpt
        assert ckpt.extras == {"0._packed_params.dtype": "qint8",  # packed tuples are weights
                               "2._packed_params.dtype": "qint8"}
        weight, bias = model.state_dict()["0._packed_params._packed_params"]
        _assert_same_quantized(ckpt.get("0._packed_params._packed_params.0"), weight)
        assert torch.equal(ckpt.get("0._packed_params._packed_params.1"), bias)


def test_quantized_checkpoint_grafts_into_the_float_model_dequantized(
        quantized_file: tuple[Path, nn.Module]) -> None:
    path, model = quantized_file
    target = _float_model(seed=1)
    report = tg.graft(path, target)
    assert report.ok and report.loaded == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert report.adapted["0.weight"] == "dequantized from qint8"
    assert any("dequantized" in w for w in report.warnings)
    packed = model.state_dict()
    for i in (0, 2):
        weight, bias = packed[f"{i}._packed_params._packed_params"]
        assert torch.equal(target[i].weight, weight.dequantize())
        assert torch.equal(target[i].bias, bias)
    assert set(report.unused) == {"0.scale", "0.zero_point", "2.scale", "2.zero_point"}


def test_same_quantized_architecture_loads_like_load_state_dict(
        quantized_file: tuple[Path, nn.Module]) -> None:
    path, model = quantized_file
    target, plain = _quantize(_float_model(seed=1)), _quantize(_float_model(seed=2))
    plain.load_state_dict(torch.load(path, weights_only=True))
    report = tg.graft(path, nn.DataParallel(target), strict=True)
    assert report.ok and report.clean and not report.missing and not report.unused
    assert "0._packed_params._packed_params.0" in report.loaded
    for key, value in plain.state_dict().items():
        got = target.state_dict()[key]
        for mine, theirs in zip(value if isinstance(value, tuple) else (value,),
                                got if isinstance(got, tuple) else (got,), strict=True):
            if isinstance(theirs, torch.Tensor) and theirs.is_quantized:
                _assert_same_quantized(mine, theirs)
            else:
                assert mine == theirs if not isinstance(mine, torch.Tensor) else torch.equal(
                    mine, theirs)
    x = torch.randn(4, 8)
    assert torch.equal(target(x), model(x)) and torch.equal(target(x), plain(x))


def test_quantized_target_refuses_what_load_state_dict_would_not_load(tmp_path: Path) -> None:
    floats = tmp_path / "float.pt"
    torch.save(_float_model().state_dict(), floats)
    report = tg.graft(floats, _quantize(_float_model(seed=1)))
    assert not report.ok and "0._packed_params._packed_params.0" in report.missing
    assert "Graft into the float model, then quantize it" in report.reasons[
        "0._packed_params._packed_params.0"]
    wider = tmp_path / "wider.pt"
    torch.manual_seed(0)
    torch.save(_quantize(nn.Sequential(nn.Linear(8, 7), nn.ReLU(), nn.Linear(7, 3)))
               .state_dict(), wider)
    target = _quantize(_float_model(seed=1))
    before = target.state_dict()["0._packed_params._packed_params"][0].int_repr().clone()
    shaped = tg.graft(wider, target)
    assert not shaped.ok and "(7, 8)" in shaped.reasons["0._packed_params._packed_params.0"]
    assert torch.equal(target.state_dict()["0._packed_params._packed_params"][0].int_repr(),
                       before)
    with pytest.raises(tg.GraftError):
        tg.graft(wider, _quantize(_float_model(seed=1)), strict=True)


def test_quantized_module_source_grafts_into_float_model(
        quantized_file: tuple[Path, nn.Module]) -> None:
    _path, model = quantized_file
    target = _float_model(seed=2)
    report = tg.graft(model, target)
    assert report.ok
    weight, _bias = model.state_dict()["2._packed_params._packed_params"]
    assert torch.equal(target[2].weight, weight.dequantize())


def test_convert_keeps_quantized_tensors_in_torch_files(
        quantized_file: tuple[Path, nn.Module], tmp_path: Path) -> None:
    path, model = quantized_file
    report = tg.convert(path, tmp_path / "copy.pt")
    assert not report.extras_dropped
    copied = torch.load(tmp_path / "copy.pt", weights_only=True)
    weight, _bias = model.state_dict()["0._packed_params._packed_params"]
    _assert_same_quantized(copied["0._packed_params._packed_params.0"], weight)


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_formats_without_quantized_dtypes_refuse_them_with_the_fix(
        quantized_file: tuple[Path, nn.Module], tmp_path: Path, suffix: str) -> None:
    path, model = quantized_file
    out = tmp_path / f"out{suffix}"
    with pytest.raises(UnsupportedCheckpointError, match=r"out\.\w+: '0\._packed_params\."
                       r"_packed_params\.0' is qint8.*dtype=torch\.float32 \(--dtype float32\)"):
        tg.convert(path, out)
    assert not out.exists() and not list(tmp_path.glob(".out*"))
    tg.convert(path, out, dtype="float32")
    weight, _bias = model.state_dict()["0._packed_params._packed_params"]
    assert torch.equal(tg.load(out)["0._packed_params._packed_params.0"], weight.dequantize())


def _values() -> TensorRef:
    ints = torch.zeros(4, 6, dtype=torch.int8)
    return TensorRef(TensorMeta.of((4, 6), torch.int8), lambda: ints)


@pytest.mark.parametrize("quantizer", [
    (),
    (torch.per_tensor_affine, "0.1", 0),
    (torch.per_tensor_affine, 0.1),
    (torch.per_channel_affine, 0.1, 0, 0),
    (torch.per_channel_affine, TensorRef(TensorMeta.of((3,), torch.float64), torch.ones),
     TensorRef(TensorMeta.of((3,), torch.int64), torch.zeros), 0),
    (torch.per_channel_affine, TensorRef(TensorMeta.of((4,), torch.float64), torch.ones),
     TensorRef(TensorMeta.of((4,), torch.int64), torch.zeros), 5),
])
def test_malformed_quantizer_records_are_refused(quantizer: tuple[object, ...]) -> None:
    with pytest.raises(CorruptCheckpointError, match="quantize"):
        quantized_ref(_values(), torch.qint8, quantizer)


def test_unknown_quantization_scheme_is_unsupported() -> None:
    with pytest.raises(UnsupportedCheckpointError, match="quantization scheme"):
        quantized_ref(_values(), torch.qint8, (torch.per_tensor_symmetric, 0.1, 0))


@pytest.mark.parametrize("scales, points", [
    (torch.int8, torch.int64), (torch.int64, torch.int64), (torch.bool, torch.int64),
    (torch.float64, torch.bool), (torch.float64, torch.complex64),
])
def test_per_channel_parameters_of_the_wrong_dtype_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scales: torch.dtype,
        points: torch.dtype) -> None:
    weight = torch.quantize_per_channel(torch.randn(4, 6), torch.rand(4, dtype=torch.float64)
                                        + 0.01, torch.arange(4), 0, torch.qint8)
    path = tmp_path / "q.pt"
    torch.save({"w": weight}, path)
    _assert_same_quantized(tg.load(path)["w"], weight)  # the control
    # The same file as torch writes it, its scales and zero points recorded in other dtypes.
    real_scales = torch.Tensor.q_per_channel_scales
    real_points = torch.Tensor.q_per_channel_zero_points
    monkeypatch.setattr(torch.Tensor, "q_per_channel_scales",
                        lambda self: real_scales(self).to(scales))
    monkeypatch.setattr(torch.Tensor, "q_per_channel_zero_points",
                        lambda self: real_points(self).to(points))
    torch.save({"w": weight}, path)
    monkeypatch.undo()
    with pytest.raises(CorruptCheckpointError, match=f"scales of {scales} and zero points of "
                                                     f"{points}"):
        tg.open(path)
