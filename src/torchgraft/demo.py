"""Example checkpoints of the problems torchgraft solves, written by the real libraries."""

from __future__ import annotations

import functools
import json
import os
import pickle
import shutil
import sys
import types
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from .graft import GraftReport

__all__ = ["MODELS_MODULE", "Example", "GraftStep", "LeNet", "LeNetBN", "SequentialLeNet",
           "graft_tour", "plain_error", "write_examples"]

#: ``mymodels.py``, written beside the examples: what the tour's ``--model mymodels:...``
#: command lines build.
MODELS_MODULE = '''"""The demo's models, for its command lines: --model mymodels:LeNet."""
from torchgraft.demo import LeNet, LeNetBN, SequentialLeNet

__all__ = ["LeNet", "LeNetBN", "SequentialLeNet"]
'''


class LeNet(nn.Module):
    """A LeNet: 3x32x32 input, 10 classes."""

    def __init__(self, num_classes: int = 10, in_chans: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_chans, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Classify a batch of 3x32x32 images."""
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        logits: torch.Tensor = self.fc3(torch.relu(self.fc2(x)))
        return logits


class LeNetBN(nn.Module):
    """PyTorch twin of the shipped Paddle LeNet-BN (scripts/make_paddle_example.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Classify a batch of 3x32x32 images."""
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        logits: torch.Tensor = self.fc3(torch.relu(self.fc2(x)))
        return logits


def SequentialLeNet() -> nn.Module:
    """The same LeNet written as ``features``/``classifier``: no name in common."""
    return nn.Sequential(OrderedDict(
        features=nn.Sequential(nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()),
        classifier=nn.Sequential(nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                                 nn.Linear(84, 10)),
    ))


def _pretrained() -> LeNet:
    torch.manual_seed(0)
    return LeNet().eval()


def plain_error(attempt: Callable[[], object]) -> str:
    """Run the plain PyTorch way and return the error it gives, in one line ("" if none).

    Args:
        attempt: What a user would try, e.g. ``lambda: torch.load(path)``.

    Returns:
        ``"RuntimeError: Attempting to deserialize object on CUDA device 1..."``, or ``""``.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            attempt()
    except Exception as exc:  # the point is to show whatever PyTorch raises
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        useful = next((line for line in lines if "Unsupported global" in line or
                       "Missing key" in line or "size mismatch" in line), lines[0] if lines
                      else "")
        return f"{type(exc).__name__}: {useful}"
    return ""


@dataclass(frozen=True)
class Example:
    """One example checkpoint.

    Attributes:
        title: The problem, in a user's words.
        problem: Where it comes from.
        path: Where it was written.
        plain: What a user would try with plain PyTorch.
        python: The torchgraft line to do it yourself (``{file}`` is the file's name).
        cli: The command line to do it yourself.
        expect_refusal: True for the file that must be refused (a code payload).
    """

    title: str
    problem: str
    path: Path
    plain: Callable[[], object]
    python: str = 'tg.load("{file}")'
    cli: str = "torchgraft inspect {file}"
    expect_refusal: bool = False


class _Payload:
    """A pickle payload that would run a shell command if unpickled naively (an ``echo``)."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo this payload ran: the loader executed code from the file",))


def _save_on(device: str, obj: object, path: Path, **kwargs: object) -> None:
    """``torch.save`` as if the tensors lived on ``device`` (no GPU needed)."""
    with mock.patch("torch.serialization.location_tag", return_value=device):
        torch.save(obj, path, **kwargs)  # type: ignore[arg-type]


def _whole_model_unimportable(model: nn.Module, path: Path) -> None:
    """``torch.save(model)`` with the class in a module that no longer exists afterwards."""
    module = types.ModuleType("my_lab_models")
    cls = type("LeNet", (LeNet,), {"__module__": "my_lab_models"})
    module.LeNet = cls  # type: ignore[attr-defined]
    sys.modules["my_lab_models"] = module
    try:
        clone = cls()
        clone.load_state_dict(model.state_dict())
        torch.save(clone, path)
    finally:
        del sys.modules["my_lab_models"]


def _sharded(state: dict[str, torch.Tensor], directory: Path) -> Path:
    directory.mkdir()
    names = list(state)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:]), start=1):
        shard = f"model-{i:05d}-of-00002.safetensors"
        save_file({n: state[n].contiguous() for n in part}, directory / shard)
        weight_map.update(dict.fromkeys(part, shard))
    index = directory / "model.safetensors.index.json"
    total = sum(t.numel() * t.element_size() for t in state.values())
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return index


def _dcp(state: dict[str, torch.Tensor], directory: Path) -> Path:
    from torch.distributed.checkpoint.state_dict_saver import save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save({"model": dict(state), "step": 1200}, checkpoint_id=str(directory))
    return directory


def write_examples(directory: Path) -> list[Example]:
    """Write one checkpoint per problem into ``directory``.

    Args:
        directory: An existing, empty folder.

    Returns:
        The examples, in the order the demo shows them.
    """
    model = _pretrained()
    state = model.state_dict()
    d = directory
    _save_on("cuda:1", nn.DataParallel(model).state_dict(), d / "dataparallel_cuda1.pth")
    torch.save({"epoch": 12, "best_acc": 0.913, "arch": "lenet",
                "state_dict": nn.DataParallel(model).state_dict(),
                "optimizer": torch.optim.SGD(model.parameters(), lr=0.01,
                                             momentum=0.9).state_dict()},
               d / "myfile.pth.tar")
    _save_on("cuda:0", state, d / "from_pytorch_1_7_legacy.pth",
             _use_new_zipfile_serialization=False)
    _whole_model_unimportable(model, d / "whole_model.pt")
    save_file({k: v.contiguous() for k, v in state.items()}, d / "lenet.safetensors",
              metadata={"format": "pt"})
    index = _sharded(state, d / "sharded")
    dcp_dir = _dcp(state, d / "dcp_checkpoint")
    shutil.copyfile(str(resources.files("torchgraft") / "examples" / "lenet_bn.pdparams"),
                    d / "lenet_bn.pdparams")
    np.savez(d / "lenet.npz", **{k: v.numpy() for k, v in state.items()})
    (d / "mymodels.py").write_text(MODELS_MODULE)
    with (d / "payload.pkl").open("wb") as f:
        pickle.dump({"conv1.weight": state["conv1.weight"].numpy(), "hook": _Payload()}, f)
    def load_into_lenet(path: Path, loader: Callable[[Path], object] = torch.load) -> object:
        return LeNet().load_state_dict(loader(path))  # type: ignore[arg-type]

    return [
        Example("My model was trained on 2 GPUs with DataParallel; I load it on a laptop",
                "a DataParallel state dict saved on cuda:1", d / "dataparallel_cuda1.pth",
                lambda: load_into_lenet(d / "dataparallel_cuda1.pth")),
        Example("The weights are inside a training checkpoint (myfile.pth.tar)",
                "epoch, state_dict, optimizer in one file", d / "myfile.pth.tar",
                lambda: load_into_lenet(d / "myfile.pth.tar",
                                        lambda p: torch.load(p, map_location="cpu"))),
        Example("A colleague's file from an old PyTorch, saved on a GPU",
                "the pre-1.6 (non-zip) layout, from cuda:0", d / "from_pytorch_1_7_legacy.pth",
                lambda: torch.load(d / "from_pytorch_1_7_legacy.pth")),
        Example("Someone saved the whole model, and its code is gone",
                "torch.save(model) of a class that no longer exists", d / "whole_model.pt",
                lambda: torch.load(d / "whole_model.pt", map_location="cpu")),
        Example("The weights come as safetensors",
                "from the Hugging Face world", d / "lenet.safetensors",
                lambda: torch.load(d / "lenet.safetensors")),
        Example("The checkpoint is split into shards with an index",
                "model-0000x-of-00002.safetensors", index,
                lambda: torch.load(index), cli="torchgraft inspect {folder}"),
        Example("The checkpoint was written by several GPUs (torch.distributed.checkpoint)",
                "a DCP folder", dcp_dir, lambda: torch.load(dcp_dir)),
        Example("The pretrained weights are PaddlePaddle's, and I have no paddle",
                "a .pdparams file", d / "lenet_bn.pdparams",
                lambda: torch.load(d / "lenet_bn.pdparams")),
        Example("The weights were exported as NumPy arrays", "an .npz file", d / "lenet.npz",
                lambda: torch.load(d / "lenet.npz")),
        Example("I downloaded a checkpoint from a stranger", "a pickle that runs a command",
                d / "payload.pkl", lambda: torch.load(d / "payload.pkl"),
                python='tg.open("{file}")', expect_refusal=True),
    ]


@dataclass(frozen=True)
class GraftStep:
    """One graft of the tour, with the check that shows it worked.

    Attributes:
        title: A one-line description.
        problem: The problem it solves, in a user's words.
        report: The graft report.
        check: What was compared, and the result.
        passed: Whether the check passed.
        plain: The error plain PyTorch gives (``load_state_dict``), or ``""``.
        python: The torchgraft line to do it yourself.
        cli: The command line to do it yourself.
    """

    title: str
    problem: str
    report: GraftReport
    check: str
    passed: bool
    plain: str = ""
    python: str = ""
    cli: str = ""


def graft_tour(directory: Path) -> list[GraftStep]:
    """Graft the examples written by :func:`write_examples` into models that differ.

    Each graft is checked on outputs: the grafted model against the model the checkpoint was
    saved from (for Paddle, the logits Paddle computed when the example was made).

    Args:
        directory: The folder :func:`write_examples` wrote.

    Returns:
        The steps, each with its report and output check.
    """
    from .graft import graft

    pretrained = _pretrained()
    torch.manual_seed(1)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = pretrained(x)
    x_rgbd = torch.cat([x, torch.zeros(2, 1, 32, 32)], dim=1)
    with resources.as_file(resources.files("torchgraft") / "examples" / "lenet_bn_io.npz") as f:
        paddle_io = np.load(f)
        paddle_x, paddle_logits = (torch.from_numpy(paddle_io[k]) for k in ("x", "logits"))
    variant = {"num_classes": 21, "in_chans": 4}
    cases: list[tuple[str, str, str, str, dict[str, int], torch.Tensor, torch.Tensor, str]] = [
        ("DataParallel checkpoint saved on cuda:1 -> bare LeNet on this CPU",
         "strip 'module.' and map cuda:1 to the CPU, in one call",
         "dataparallel_cuda1.pth", "LeNet", {}, x, expected, "outputs equal the trained model's"),
        ("pretrained LeNet -> a 4-channel, 21-class variant",
         "a new first conv and a new head; label_map keeps the 10 known classes",
         "lenet.safetensors", "LeNet", variant, x_rgbd, expected,
         "with the 4th channel zero, its first 10 logits equal the pretrained model's"),
        ("PaddlePaddle LeNet-BN .pdparams -> PyTorch", "PaddlePaddle weights to PyTorch",
         "lenet_bn.pdparams", "LeNetBN", {}, paddle_x, paddle_logits,
         "logits equal those Paddle computed (BatchNorm statistics renamed, Linear weights "
         "transposed; paddle not needed)"),
        ("LeNet rewritten as nn.Sequential: no name in common",
         "the layers were renamed", "whole_model.pt", "SequentialLeNet", {}, x, expected,
         "matched by structure; outputs equal the trained model's"),
    ]
    label_maps: dict[str, list[int]] = {"lenet.safetensors": list(range(10))}
    factories: dict[str, Callable[..., nn.Module]] = {
        "LeNet": LeNet, "LeNetBN": LeNetBN, "SequentialLeNet": SequentialLeNet}
    steps = []
    for title, problem, file, factory, kwargs, inputs, reference, claim in cases:
        model = factories[factory](**kwargs).eval()
        plain = plain_error(functools.partial(_plain_load, model, directory / file))
        report = graft(directory / file, model, label_map=label_maps.get(file))
        with torch.no_grad():
            outputs = model(inputs)[:, : reference.shape[1]]
        diff = float((outputs - reference).abs().max())
        passed = report.ok and diff <= 1e-4 * float(reference.abs().max())
        built = f"{factory}({', '.join(f'{k}={v}' for k, v in kwargs.items())})"
        option = ", label_map=list(range(10))" if file in label_maps else ""
        cli = f"torchgraft graft {file} --model mymodels:{factory}"
        if kwargs:
            cli += f" --model-kwargs '{json.dumps(kwargs)}'"
        if file in label_maps:
            cli += f" --label-map '{json.dumps(label_maps[file])}'"
        steps.append(GraftStep(
            title, problem, report, f"{claim}: max |diff| = {diff:.3g}", passed, plain,
            f'tg.graft("{file}", {built}{option})',
            f"{cli} --out grafted_{Path(file).name.partition('.')[0]}.safetensors"))
    return steps


def _plain_load(model: nn.Module, path: Path) -> object:
    """What a user would do with plain PyTorch: ``load_state_dict`` of the file's tensors."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return model.load_state_dict(load_file(path))
    return model.load_state_dict(torch.load(path, map_location="cpu"))
