"""MLX: an mlx-lm folder quantized and saved by mlx-lm itself, grafted into transformers' Llama."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import torchgraft as tg
from tests.helpers import BOUNDED, calls
from torchgraft.errors import (
    CorruptCheckpointError,
    TorchgraftError,
    UnsupportedCheckpointError,
)
from torchgraft.io.mlx_quant import unpack

FIXTURES = Path(__file__).parent.parent / "fixtures" / "frameworks" / "mlx"
FOLDER = FIXTURES / "llama_q4"
transformers = pytest.importorskip("transformers")


def _llama(layers: int = 2) -> torch.nn.Module:
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=layers, num_attention_heads=4,
                                      num_key_value_heads=2, rms_norm_eps=1e-6,
                                      rope_theta=10000.0, tie_word_embeddings=False,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def test_quantized_mlx_lm_folder_grafts_with_mlx_outputs() -> None:
    io = np.load(FIXTURES / "llama_q4_io.npz")
    with tg.open(FOLDER) as ckpt:
        assert ckpt.format == "mlx"
        # Dequantized exactly as mx.dequantize does it.
        np.testing.assert_array_equal(ckpt["model.layers.0.self_attn.q_proj.weight"].numpy(),
                                      io["q_proj_0"])
        assert not any(name.endswith((".scales", ".biases")) for name in ckpt)
    model = _llama()
    report = tg.graft(FOLDER, model)
    assert report.ok, report
    with torch.no_grad():
        logits = model(torch.from_numpy(io["ids"]).long()).logits.numpy()
    # MLX runs the quantized matmuls itself; measured difference 7e-7 (logits up to 1.6).
    np.testing.assert_allclose(logits, io["logits"], rtol=0, atol=1e-5)


def test_inspect_shows_the_quantization_and_convert_writes_floats(tmp_path: Path) -> None:
    info = tg.inspect(FOLDER)
    assert info.format == "mlx"
    assert info.extras["__metadata__"]["quantization"]["bits"] == 4
    out = tmp_path / "llama.safetensors"
    tg.convert(FOLDER, out)
    assert tg.load(out)["lm_head.weight"].dtype == torch.float32


def test_a_layer_more_is_never_ok() -> None:
    assert not tg.graft(FOLDER, _llama(layers=3), strict=False).ok


def _copy(tmp_path: Path, quantization: object, source: Path = FOLDER) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_wrong_bits_or_mode_are_errors(tmp_path: Path) -> None:
    with pytest.raises(CorruptCheckpointError, match="do not fit"):
        tg.open(_copy(tmp_path / "a", {"group_size": 32, "bits": 8}))
    # mxfp4 has no biases and uint8 scales: this affine folder's tensors do not fit.
    with pytest.raises(CorruptCheckpointError, match="do not fit.*mxfp4"):
        tg.open(_copy(tmp_path / "b", {"group_size": 32, "bits": 4, "mode": "mxfp4"}))
    with pytest.raises(UnsupportedCheckpointError, match="'fp3' mode"):
        tg.open(_copy(tmp_path / "c", {"group_size": 32, "bits": 4, "mode": "fp3"}))


MODES_FOLDER = FIXTURES / "llama_modes"
#: The modes fixture's quantization: mxfp4 by default, other modes per module (mlx-lm's).
MODES_CONFIG = json.loads((MODES_FOLDER / "config.json").read_text())["quantization"]


def test_every_mlx_mode_dequantizes_as_mx_dequantize_and_grafts() -> None:
    """mxfp4, nvfp4, mxfp8 and 3-, 5-, 6-bit affine: the values and dtype of mx.dequantize."""
    io = np.load(FIXTURES / "llama_modes_io.npz")
    checked = [name for name in io if name.endswith(".weight")]
    with tg.open(MODES_FOLDER) as ckpt:
        assert not any(name.endswith((".scales", ".biases")) for name in ckpt)
        for name in checked:
            tensor = ckpt[name]
            assert str(io[name.replace(".weight", ".dtype")]).endswith(
                str(tensor.dtype).removeprefix("torch."))
            np.testing.assert_array_equal(tensor.float().numpy(), io[name])
    modes = {MODES_CONFIG.get(name.removesuffix(".weight"), MODES_CONFIG).get("mode")
             for name in checked}
    assert modes >= {"mxfp4", "nvfp4", "mxfp8", "affine"}
    model = _llama()
    report = tg.graft(MODES_FOLDER, model)
    assert report.ok, report
    with torch.no_grad():
        logits = model(torch.from_numpy(io["ids"]).long()).logits.numpy()
    # MLX runs the quantized matmuls itself; measured difference 7.2e-7 (logits up to 1.8).
    np.testing.assert_allclose(logits, io["logits"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_modes_folder_converts_to_the_dequantized_weights(tmp_path: Path, suffix: str) -> None:
    info = tg.inspect(MODES_FOLDER)
    assert info.extras["__metadata__"]["quantization"]["mode"] == "mxfp4"
    assert info.extras["__metadata__"]["dequantized"] == {
        "mxfp4 4-bit, groups of 32": 7, "nvfp4 4-bit, groups of 16": 3,
        "mxfp8 8-bit, groups of 32": 3, "affine 3-bit, groups of 32": 1,
        "affine 6-bit, groups of 64": 1, "affine 5-bit, groups of 32": 1}
    out = tmp_path / f"llama{suffix}"
    tg.convert(MODES_FOLDER, out)
    written = tg.load(out)
    with tg.open(MODES_FOLDER) as ckpt:
        assert set(written) == set(ckpt)
        for name in ("model.layers.0.mlp.down_proj.weight", "lm_head.weight"):
            assert torch.equal(written[name], ckpt[name])


def _claim(module: str, **entry: object) -> dict[str, object]:
    return {**MODES_CONFIG, module: {**MODES_CONFIG.get(module, {}), **entry}}


@pytest.mark.parametrize(("quantization", "error", "match"), [
    # The default claimed as nvfp4 (groups of 16) for mxfp4 weights (groups of 32).
    ({**MODES_CONFIG, "group_size": 16, "mode": "nvfp4"}, CorruptCheckpointError, "do not fit"),
    # An nvfp4 module claimed as mxfp4: twice the groups are stored.
    (_claim("model.layers.0.mlp.gate_proj", group_size=32, mode="mxfp4"),
     CorruptCheckpointError, "do not fit"),
    # A group size the mode does not have.
    (_claim("model.layers.0.mlp.gate_proj", group_size=32), CorruptCheckpointError,
     "nvfp4 mode has"),
    # mxfp8 claimed for 6-bit affine (biases, float scales), and affine for mxfp8.
    (_claim("model.layers.1.self_attn.o_proj", bits=8, group_size=32, mode="mxfp8"),
     CorruptCheckpointError, "do not fit"),
    (_claim("model.layers.1.mlp.up_proj", mode="affine"), CorruptCheckpointError, "do not fit"),
    # The wrong affine width: 5 bits claimed for the 6-bit module.
    (_claim("model.layers.1.self_attn.o_proj", bits=5), CorruptCheckpointError, "do not fit"),
    (_claim("lm_head", global_scale=True), UnsupportedCheckpointError, "global scale"),
    (_claim("lm_head", mode=["affine"]), UnsupportedCheckpointError, "mode"),
])
def test_a_wrong_claim_is_an_error_never_other_values(
        tmp_path: Path, quantization: dict[str, object], error: type[Exception],
        match: str) -> None:
    with pytest.raises(error, match=match):
        tg.open(_copy(tmp_path, quantization, MODES_FOLDER))



@pytest.mark.parametrize("group_size", [0, -32, 7])
def test_a_group_size_mlx_cannot_have_is_an_error_not_a_crash(tmp_path: Path,
                                                             group_size: int) -> None:
    folder = _copy(tmp_path, {"group_size": group_size, "bits": 4})
    with pytest.raises(CorruptCheckpointError, match=f"group_size {group_size}"
                       if group_size <= 0 else "do not fit"):
        tg.open(folder)  # group_size 0 was a ZeroDivisionError, reported as a bug


def test_bits_that_are_a_boolean_are_no_mlx_claim(tmp_path: Path) -> None:
    with tg.open(_copy(tmp_path, {"group_size": 64, "bits": True})) as ckpt:
        assert ckpt.format != "mlx"


def _own_claim() -> object:
    return json.loads((FOLDER / "config.json").read_text())["quantization"]


def test_a_config_linking_out_of_the_folder_is_refused_unless_followed(tmp_path: Path) -> None:
    folder = _copy(tmp_path, _own_claim())
    outside = tmp_path / "elsewhere.json"
    shutil.move(folder / "config.json", outside)
    (folder / "config.json").symlink_to(outside)
    with pytest.raises(tg.OutsideCheckpointError, match="config.json"):
        tg.open(folder)
    with tg.open(folder, follow_links=True) as ckpt:  # the user trusts where it leads
        assert ckpt.format == "mlx"


@pytest.mark.timeout(30)
def test_a_config_that_is_a_fifo_is_never_opened(tmp_path: Path) -> None:
    folder = _copy(tmp_path, _own_claim())
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    with tg.open(folder) as ckpt:  # not an mlx-lm folder that can be read: packed, as stored
        assert ckpt.format != "mlx"
        assert ckpt["lm_head.weight"].dtype == torch.uint32


def test_a_truncated_shard_or_a_config_bomb_is_an_error_in_bounded_time(tmp_path: Path) -> None:
    folder = tmp_path / "cut"
    shutil.copytree(MODES_FOLDER, folder)
    shard = folder / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(TorchgraftError):
        tg.load(folder)
    # A config nested 100,000 deep is not an mlx-lm config: the packed tensors stay as stored
    # (uint32 words), which no float model takes.
    bomb = _copy(tmp_path / "bomb", {}, MODES_FOLDER)
    (bomb / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    def opened() -> None:
        with tg.open(bomb) as ckpt:
            assert ckpt.format != "mlx"
            assert ckpt["lm_head.weight"].dtype == torch.uint32

    assert calls(opened) < BOUNDED  # the config's 100,000 levels are not walked
    assert not tg.graft(bomb, _llama(), strict=False).ok

@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 8])
def test_codes_unpack_as_one_little_endian_bit_stream(bits: int) -> None:
    words = torch.randint(0, 2**32, (3, 3 * bits), generator=torch.Generator().manual_seed(bits),
                          dtype=torch.int64).to(torch.uint32)
    stream = np.unpackbits(words.numpy().view(np.uint8), axis=-1, bitorder="little")
    expected = stream.reshape(3, -1, bits) @ (1 << np.arange(bits))
    np.testing.assert_array_equal(unpack(words, bits).numpy(), expected)


class MlxCNN(torch.nn.Module):
    """The MLX CNN (channels-last input): Conv2d(3, 4, 3), Conv2d(4, width, 3), Linear."""

    def __init__(self, width: int = 6) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.conv2 = torch.nn.Conv2d(4, width, 3, padding=1)
        self.fc = torch.nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv2(torch.relu(self.conv(x.permute(0, 3, 1, 2)))))
        return self.fc(y.mean((2, 3)))  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["cnn.safetensors", "cnn.npz"])
def test_save_weights_convolutions_are_permuted_from_channels_last(name: str) -> None:
    """save_weights files carry no marker: conv2 ([6, 3, 3, 4]) fits only as [out, kh, kw,
    in], which tells the layout; conv ([4, 3, 3, 3]) reads the same either way."""
    io = np.load(FIXTURES / "cnn_io.npz")
    model = MlxCNN().eval()
    report = tg.graft(FIXTURES / name, model)
    assert report.ok, report
    assert "axes permuted" in str(report)
    with torch.no_grad():
        np.testing.assert_allclose(model(torch.from_numpy(io["x"])).numpy(), io["y"],
                                   rtol=1e-5, atol=1e-6)


def test_another_width_is_never_ok() -> None:
    assert not tg.graft(FIXTURES / "cnn.safetensors", MlxCNN(width=8), strict=False).ok


def test_a_channels_last_graft_is_compared_with_its_source_model() -> None:
    """Permuted axes are a layout, decided from the plan's operations: with ``source_model=``
    the graft is compared under ``verify="auto"`` (a cast is not, its twin)."""
    compared = tg.graft(FIXTURES / "cnn.safetensors", MlxCNN().eval(), source_model=MlxCNN,
                        example_inputs=torch.randn(1, 8, 8, 3))
    assert compared.ok and compared.verified_with and compared.max_abs_diff is not None
    narrowed = MlxCNN().half().eval()
    cast = tg.graft(FIXTURES / "cnn.safetensors", narrowed, source_model=MlxCNN,
                    example_inputs=torch.randn(1, 8, 8, 3).half())
    assert cast.max_abs_diff is None and cast.verified_with is None
