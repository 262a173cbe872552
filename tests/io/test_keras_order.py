"""What a Keras file states of its model: the order of its layers and their classes.

Files written by Keras itself (``scripts/make_framework_fixtures.py keras-siblings``), grafted
as bare files into PyTorch twins whose names share nothing with them. A ``.keras`` archive's
config lists the layers in the model's order and its weights file numbers each class's layers
in that order: two records that agree make same-shape siblings known, not guessed. Each case
has a broken twin that must never be ok.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchgraft as tg
from torchgraft.graft.evidence import Evidence

h5py = pytest.importorskip("h5py")
FIXTURES = Path(__file__).parent.parent / "fixtures" / "frameworks" / "keras"


class Siblings(nn.Module):
    """The Keras Sequential (``zeta``, ``alpha``, ``mid``, ``head``) under another code base's
    names: three same-shape Linear layers and a head."""

    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        self.hidden = nn.ModuleList([nn.Linear(8, 8) for _ in range(depth)])
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.out(x)  # type: ignore[no-any-return]


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = width // heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (p(x).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k,
                                                                             self.v))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.o(y.transpose(1, 2).reshape(b, t, c))  # type: ignore[no-any-return]


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=1e-3)
        self.attn = Attention(width, 2)
        self.norm2 = nn.LayerNorm(width, eps=1e-3)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))  # type: ignore[no-any-return]


class Encoder(nn.Module):
    """The flat Keras functional encoder, as a PyTorch code base writes it: blocks."""

    def __init__(self, depth: int = 2, width: int = 8, vocab: int = 12) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.norm = nn.LayerNorm(width, eps=1e-3)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # type: ignore[no-any-return]


class BasicBlock(nn.Module):
    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = nn.Sequential(nn.Conv2d(inputs, width, 1, stride, bias=False),
                                        nn.BatchNorm2d(width)) \
            if inputs != width or stride != 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (x if self.downsample is None else self.downsample(x)))


class TinyResNet(nn.Module):
    """torchvision's ResNet layout (``conv1``, ``layer1.0.bn2``, ``downsample``), small."""

    def __init__(self, depths: tuple[int, int] = (2, 1)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.layer1 = nn.Sequential(*(BasicBlock(8, 8, 1) for _ in range(depths[0])))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, 2),
                                    *(BasicBlock(16, 16, 1) for _ in range(depths[1] - 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        return self.layer2(self.layer1(x)).mean((2, 3), keepdim=True)  # type: ignore[no-any-return]


def _outputs(model: nn.Module, io_name: str, key: str = "x") -> tuple[np.ndarray, np.ndarray]:
    io = np.load(FIXTURES / io_name)
    given = torch.from_numpy(io[key])
    with torch.no_grad():
        out = model.eval()(given.long() if key == "ids" else given)
    return out.numpy(), io["y"]


def _equal(model: nn.Module, io_name: str, key: str = "x") -> bool:
    out, expected = _outputs(model, io_name, key)
    return bool(np.allclose(out, expected, rtol=1e-4, atol=1e-5))


def _metadata(path: Path) -> dict[str, Any]:
    metadata = tg.inspect(path).extras["__metadata__"]
    assert isinstance(metadata, dict)
    return metadata


def test_an_archive_states_its_order_so_same_shape_siblings_are_known() -> None:
    """Three same-shape Dense layers named against their order (``zeta`` first, ``alpha``
    second): the config's order and the weights' own numbers agree, and the model's numbers
    follow them. Before: UNVERIFIED, the three a guess."""
    model = Siblings()
    report = tg.graft(FIXTURES / "siblings.keras", model, strict=False)
    assert report.ok, report
    assert set(report.evidence.values()) == {Evidence.STRUCTURE}
    assert report.mapping["hidden.0.weight"] == "zeta.weight"
    assert report.mapping["hidden.1.weight"] == "alpha.weight"
    assert _equal(model, "siblings_io.npz")


def test_the_model_order_comes_from_the_file_however_its_names_sort() -> None:
    metadata = _metadata(FIXTURES / "siblings.keras")
    assert metadata["order"] == "stated"
    assert list(tg.load(FIXTURES / "siblings.keras"))[:3] == [
        "zeta.weight", "zeta.bias", "alpha.weight"]
    assert metadata["numbers"]["alpha.weight"] == ["/layers/dense", 1]
    assert set(metadata["kinds"].values()) == {"linear"}


def test_a_config_that_lies_about_order_is_never_ok() -> None:
    """The same archive, its config listing ``zeta`` and ``alpha`` exchanged: the config and
    the weights' numbers disagree, so the file states no order."""
    assert _metadata(FIXTURES / "siblings_lying.keras")["order"] == "unknown"
    report = tg.graft(FIXTURES / "siblings_lying.keras", Siblings(), strict=False)
    assert not report.ok and report.verdict == "unverified"
    assert {"hidden.0.weight", "hidden.1.weight"} <= set(report.guesses)


def test_a_weights_file_alone_states_no_order_and_keeps_right_values() -> None:
    """save_weights keeps no config: each class's order is known (its numbers), not that of the
    model, so the siblings are guesses; the values filled are right."""
    assert _metadata(FIXTURES / "siblings.weights.h5")["order"] == "unknown"
    model = Siblings()
    report = tg.graft(FIXTURES / "siblings.weights.h5", model, strict=False)
    assert report.verdict == "unverified"
    assert {f"hidden.{k}.weight" for k in range(3)} <= set(report.guesses)
    assert _equal(model, "siblings_io.npz")


def test_another_depth_is_never_ok() -> None:
    for name in ("siblings.keras", "siblings.weights.h5", "siblings_lying.keras"):
        assert not tg.graft(FIXTURES / name, Siblings(depth=4), strict=False).ok
        assert not tg.graft(FIXTURES / name, Siblings(depth=2), strict=False).ok


def test_a_flat_encoder_is_known_but_for_the_norm_only_order_places() -> None:
    """A functional Keras model keeps every layer at its top level; the twin has blocks. The
    config's order and Keras' numbers place each block's norms, projections and attention
    (both sides number them), and the classes tell the embedding from the head of the same
    shape. The final norm against a block's norm is told apart by order alone: a guess.
    Before: 30 keys guessed."""
    model = Encoder()
    report = tg.graft(FIXTURES / "encoder.keras", model, strict=False)
    assert report.verdict == "unverified"
    guessed = {key.rpartition(".")[0] for key in report.guesses}
    assert guessed == {"norm", *(f"blocks.{b}.norm{n}" for b in (0, 1) for n in (1, 2))}
    assert all(report.guesses[f"blocks.{b}.norm{n}.weight"].alternatives == (
        "layer_normalization_4.weight",) for b in (0, 1) for n in (1, 2))
    assert report.mapping["blocks.1.attn.q.weight"] == "multi_head_attention_1.query.weight"
    assert _equal(model, "encoder_io.npz", key="ids")
    kinds = _metadata(FIXTURES / "encoder.keras")["kinds"]
    assert kinds["embedding.weight"] == "embedding" and kinds["dense_4.weight"] == "linear"
    assert kinds["multi_head_attention.query.weight"] == "linear"
    assert kinds["layer_normalization.weight"] == "norm"


def test_a_flat_encoder_from_its_weights_file_keeps_right_values() -> None:
    model = Encoder()
    report = tg.graft(FIXTURES / "encoder.weights.h5", model, strict=False)
    assert report.verdict == "unverified"
    assert _equal(model, "encoder_io.npz", key="ids")


def test_an_encoder_a_block_deeper_is_never_ok() -> None:
    for name in ("encoder.keras", "encoder.weights.h5"):
        assert not tg.graft(FIXTURES / name, Encoder(depth=3), strict=False).ok


def test_transformers_tf_model_h5_resnet_grafts_into_torchvision_names() -> None:
    """transformers' TFResNetModel (``layer.0``/``layer.1``, ``shortcut``) into torchvision's
    layout (``conv1``/``conv2``, ``downsample``): the order tf.keras made the weights in is the
    file's, numbers on both sides agree with it, a norm goes with its convolution."""
    path = FIXTURES / "tf_resnet" / "tf_model.h5"
    metadata = _metadata(path)
    assert metadata["order"] == "stated"
    assert metadata["kinds"]["resnet.embedder.embedder.normalization.running_var"] == "norm"
    model = TinyResNet()
    report = tg.graft(path, model, strict=False)
    assert report.ok, report
    out, expected = _outputs(model, "tf_resnet_io.npz")
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_tf_model_h5_listing_two_same_shape_convolutions_exchanged_is_never_ok(
        tmp_path: Path) -> None:
    """Its ``weight_names`` list a block's two same-shape convolutions exchanged: the names'
    numbers say one thing, the file's order another."""
    path = tmp_path / "tf_model.h5"
    shutil.copy(FIXTURES / "tf_resnet" / "tf_model.h5", path)
    with h5py.File(path, "r+") as f:
        group = f["resnet"]
        names = [n.decode() if isinstance(n, bytes) else n for n in group.attrs["weight_names"]]
        first = [k for k, n in enumerate(names) if "stages.0/layers.0/layer." in n
                 and n.endswith("convolution/kernel:0")]
        assert len(first) == 2
        names[first[0]], names[first[1]] = names[first[1]], names[first[0]]
        group.attrs["weight_names"] = np.array([n.encode() for n in names])
    report = tg.graft(path, TinyResNet(), strict=False)
    assert not report.ok
    assert {"layer1.0.conv1.weight", "layer1.0.conv2.weight"} <= set(report.guesses)
    assert not tg.graft(FIXTURES / "tf_resnet" / "tf_model.h5", TinyResNet(depths=(3, 1)),
                        strict=False).ok


def _with_config(tmp_path: Path, config: object) -> Path:
    """The siblings archive with another config.json."""
    path = tmp_path / "other.keras"
    with zipfile.ZipFile(FIXTURES / "siblings.keras") as source, \
            zipfile.ZipFile(path, "w") as copy:
        for info in source.infolist():
            data = source.read(info)
            copy.writestr(info, json.dumps(config).encode() if info.filename == "config.json"
                          else data)
    return path


@pytest.mark.parametrize("config", [
    [], {"config": {"layers": "dense"}}, {"config": {"layers": [1, None, {"name": 3}]}},
    {"config": {"layers": [{"class_name": "Dense", "config": {"name": "alpha"}}]}},
    {"config": {"layers": [{"class_name": "Conv2D", "name": name}
                           for name in ("zeta", "alpha", "mid", "head")]}},
])
def test_a_config_of_other_shapes_or_classes_states_nothing(tmp_path: Path,
                                                            config: object) -> None:
    """A config that is no list of layers, misses some, or gives them other classes: read as
    JSON only, it states no order, and the graft is never ok on it."""
    path = _with_config(tmp_path, config)
    assert _metadata(path)["order"] == "unknown"
    assert not tg.graft(path, Siblings(), strict=False).ok
