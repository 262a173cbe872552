"""Checkpoints written by Lightning, mmengine, DeepSpeed, diffusers and sentence-transformers.

The files under ``tests/fixtures`` were written by the libraries' own save functions
(``scripts/make_fixtures.py``; versions in ``MANIFEST.json``), with reference values the
libraries' own loaders gave. Each is inspected, loaded (bit for bit against the reference),
grafted into a fresh model of the same architecture (outputs equal to the library model's)
and converted to safetensors and back; each has a broken twin that must be caught.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F

import torchgraft as tg

FIXTURES = Path(__file__).parent / "fixtures"


class LightningTiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MMEngineTiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x).mean((2, 3)))


def _deepspeed_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 15), nn.ReLU(), nn.Linear(15, 3))


def _diffusers_model() -> nn.Module:
    from diffusers import UNet2DModel, VQModel

    folder = FIXTURES / "diffusers" / "ldm"
    return nn.ModuleDict({
        "unet": UNet2DModel.from_config(UNet2DModel.load_config(folder / "unet")),
        "vqvae": VQModel.from_config(VQModel.load_config(folder / "vqvae")),
    })


def _diffusers_outputs(model: nn.Module, io: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"y_unet": model["unet"](io["x"], io["t"]).sample,  # type: ignore[index]
            "y_vqvae": model["vqvae"](io["x"]).sample}  # type: ignore[index]


class Dense(nn.Module):
    """sentence-transformers' Dense module: a Linear and its activation."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


def _sentence_model() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig.from_json_file(FIXTURES / "sentence-transformers" / "st" / "config.json")
    return nn.ModuleDict({"0": BertModel(config), "2_Dense": Dense()})


def _sentence_outputs(model: nn.Module, io: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    mask = io["attention_mask"]
    tokens = model["0"](input_ids=io["input_ids"],  # type: ignore[index]
                        attention_mask=mask).last_hidden_state
    pooled = (tokens * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return {"embedding": F.normalize(model["2_Dense"](pooled), dim=-1)}  # type: ignore[index]


def _plain_outputs(model: nn.Module, io: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"y": model(io["x"])}


@dataclass(frozen=True)
class Writer:
    """A library's checkpoint, the architecture it holds, and how that model is run."""

    name: str
    path: str
    model: Callable[[], nn.Module]
    outputs: Callable[[nn.Module, dict[str, torch.Tensor]], dict[str, torch.Tensor]] = \
        _plain_outputs
    format: str = "torch-zip"


WRITERS = [
    Writer("lightning", "lightning/tiny.ckpt", LightningTiny),
    Writer("mmengine", "mmengine/epoch_1.pth", MMEngineTiny),
    Writer("deepspeed-zero1", "deepspeed/zero1", _deepspeed_model, format="deepspeed"),
    Writer("deepspeed-zero2-bf16", "deepspeed/zero2_bf16", _deepspeed_model, format="deepspeed"),
    Writer("deepspeed-zero3-bf16", "deepspeed/zero3_bf16", _deepspeed_model, format="deepspeed"),
    Writer("diffusers", "diffusers/ldm", _diffusers_model, _diffusers_outputs, "diffusers"),
    Writer("sentence-transformers", "sentence-transformers/st", _sentence_model,
           _sentence_outputs, "sentence-transformers"),
]


def _reference(writer: Writer) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The weights the library loaded, and an input with its model's output."""
    path = FIXTURES / writer.path
    folder = path if writer.format == "deepspeed" else path.parent
    saved = load_file(folder / "reference.safetensors")
    weights = {k.removeprefix("weights/"): v for k, v in saved.items() if k.startswith("weights/")}
    io = {k.removeprefix("io/"): v for k, v in saved.items() if k.startswith("io/")}
    return weights, io


def _library_keys(writer: Writer, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The reference under the names torchgraft gives a folder's parts."""
    if writer.name == "sentence-transformers":  # SentenceTransformer names modules 0, 2...
        return {k.replace("0.model.", "0.", 1).replace("2.", "2_Dense.", 1): v
                for k, v in weights.items()}
    return weights


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.name)
def test_inspect_and_load_bit_for_bit(writer: Writer) -> None:
    weights, _io = _reference(writer)
    expected = _library_keys(writer, weights)
    info = tg.inspect(FIXTURES / writer.path)
    assert info.format == writer.format
    loaded = tg.load(FIXTURES / writer.path)
    assert sorted(loaded) == sorted(expected)
    for key, value in expected.items():
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key


@pytest.mark.slow
@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.name)
def test_graft_gives_the_library_models_outputs(writer: Writer) -> None:
    _weights, io = _reference(writer)
    torch.manual_seed(123)
    model = writer.model().eval()
    report = tg.graft(FIXTURES / writer.path, model, strict=True)
    assert report.ok
    with torch.no_grad():
        outputs = writer.outputs(model, io)
    for key, value in outputs.items():  # the weights are bit for bit (the test above); the
        # outputs were computed when the fixture was written, on another CPU whose kernels
        # round differently: equal within float32 rounding of the output's scale
        scale = float(io[key].abs().max())
        torch.testing.assert_close(value, io[key], rtol=1e-5, atol=1e-5 * scale, msg=key)


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.name)
def test_convert_to_safetensors_and_back(writer: Writer, tmp_path: Path) -> None:
    original = tg.load(FIXTURES / writer.path)
    tg.convert(FIXTURES / writer.path, tmp_path / "model.safetensors")
    back = tg.load(tmp_path / "model.safetensors")
    assert list(back) == list(original)
    for key, value in original.items():
        assert torch.equal(back[key], value), key


def test_lightning_enum_is_recorded_not_run() -> None:
    with tg.open(FIXTURES / "lightning" / "tiny.ckpt") as ckpt:
        assert "__main__.Color" in ckpt.skipped_calls
        assert ckpt.extras["hyper_parameters"]["lr"] == 0.1


def test_mmengine_message_hub_opens_without_unsafe() -> None:
    with tg.open(FIXTURES / "mmengine" / "epoch_1.pth") as ckpt:
        assert {"meta", "message_hub", "optimizer"} <= set(ckpt.extras)


def test_deepspeed_module_as_saved_is_a_second_weight_set() -> None:
    path = FIXTURES / "deepspeed" / "zero2_bf16"
    with tg.open(path) as ckpt:
        assert ckpt.weight_sets == {"state_dict": 4, "module": 4}
        assert ckpt.extras["deepspeed"]["zero_stage"] == 2
        assert ckpt.meta("0.weight").dtype == torch.float32
    module = tg.load(path, weights_key="module")
    assert module["0.weight"].dtype == torch.bfloat16
    tag = tg.load(path / "step1")
    assert torch.equal(tag["0.weight"], tg.load(path)["0.weight"])


@pytest.mark.parametrize("folder", ["zero1", "zero2_bf16", "zero3_bf16"])
def test_deepspeed_missing_rank_file_is_caught(folder: str, tmp_path: Path) -> None:
    copy = tmp_path / folder
    shutil.copytree(FIXTURES / "deepspeed" / folder, copy)
    next((copy / "step1").glob("*zero_pp_rank_1_*optim_states.pt")).unlink()
    with pytest.raises(tg.CorruptCheckpointError, match="rank") as info:
        tg.load(copy)
    assert str(copy) in str(info.value)


def test_deepspeed_partitions_of_another_run_are_caught(tmp_path: Path) -> None:
    copy = tmp_path / "mixed"
    shutil.copytree(FIXTURES / "deepspeed" / "zero3_bf16", copy)
    other = FIXTURES / "deepspeed" / "zero2_bf16" / "step1"
    for name in ("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",):
        shutil.copy(other / name, copy / "step1" / name)
    with pytest.raises(tg.CorruptCheckpointError):
        tg.load(copy)


def test_one_part_of_a_pipeline(tmp_path: Path) -> None:
    _weights, io = _reference(WRITERS[5])
    unet = _diffusers_model()["unet"].eval()
    report = tg.graft(FIXTURES / "diffusers" / "ldm", unet, component="unet", strict=True)
    assert report.ok
    with torch.no_grad():
        torch.testing.assert_close(unet(io["x"], io["t"]).sample, io["y_unet"], rtol=1e-5,
                                   atol=1e-6)
    with pytest.raises(tg.TensorNotFoundError, match="no part 'text_encoder'.*unet, vqvae"):
        tg.open(FIXTURES / "diffusers" / "ldm", component="text_encoder")
    with pytest.raises(tg.TensorNotFoundError, match="'scheduler' holds no weights"):
        tg.open(FIXTURES / "diffusers" / "ldm", component="scheduler")
    with pytest.raises(tg.TorchgraftError, match="component='unet' picks a part"):
        tg.open(FIXTURES / "lightning" / "tiny.ckpt", component="unet")


def test_pipeline_index_pointing_outside_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "ldm"
    shutil.copytree(FIXTURES / "diffusers" / "ldm", copy)
    (tmp_path / "outside").mkdir()
    shutil.copy(copy / "unet" / "diffusion_pytorch_model.safetensors", tmp_path / "outside")
    index = json.loads((copy / "model_index.json").read_text())
    index["../outside"] = ["diffusers", "UNet2DModel"]
    (copy / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(tg.CorruptCheckpointError, match="not a folder inside"):
        tg.open(copy)


def test_dense_layer_left_out_of_the_model_is_reported(tmp_path: Path) -> None:
    """The bug this replaces: only the root weights were read and the report said nothing."""
    model = nn.ModuleDict({"0": _sentence_model()["0"]})
    report = tg.graft(FIXTURES / "sentence-transformers" / "st", model)
    assert not report.clean
    assert set(report.unused) == {"2_Dense.linear.weight", "2_Dense.linear.bias"}


def test_sentence_transformers_parts_listed(tmp_path: Path) -> None:
    with tg.open(FIXTURES / "sentence-transformers" / "st") as ckpt:
        parts = ckpt.extras["sentence-transformers"]["components"]
    assert parts["1_Pooling"] == "no weights"
    assert parts["2_Dense"] == {"format": "safetensors", "path": "2_Dense/model.safetensors",
                                "tensors": 2}



@pytest.mark.parametrize(("writer", "victim"), [
    (WRITERS[0], "tiny.ckpt"), (WRITERS[1], "epoch_1.pth"),
    (WRITERS[5], "unet/diffusion_pytorch_model.safetensors"),
    (WRITERS[6], "2_Dense/model.safetensors"),
], ids=lambda v: v.name if isinstance(v, Writer) else v)
def test_truncated_file_is_caught(writer: Writer, victim: str, tmp_path: Path) -> None:
    source = FIXTURES / writer.path
    copy = tmp_path / source.name
    if source.is_dir():
        shutil.copytree(source, copy)
        broken = copy / victim
    else:
        shutil.copy(source, copy)
        broken = copy
    broken.write_bytes(broken.read_bytes()[:-200])
    with pytest.raises(tg.CorruptCheckpointError):
        tg.graft(copy, writer.model())


def test_deepspeed_model_states_file_alone_gives_the_module() -> None:
    path = FIXTURES / "deepspeed" / "zero1" / "step1" / "mp_rank_00_model_states.pt"
    with tg.open(path) as ckpt:
        assert ckpt.format == "torch-zip" and ckpt.weights_key == "module"
        assert ckpt.extras["ds_version"] == "0.19.8"
    weights, _io = _reference(WRITERS[2])
    loaded = tg.load(path)
    for key, value in weights.items():  # ZeRO 1 in fp32: the module is the fp32 weights
        assert torch.equal(loaded[key], value)
