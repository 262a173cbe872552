"""What every other framework's reader promises (issue 18): inspect shows framework, dtype and
quantization; convert writes safetensors and .pt with the values read; TensorFlow, Keras, JAX,
Flax, Orbax and MLX are never imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchgraft as tg

FIXTURES = Path(__file__).parent.parent / "fixtures" / "frameworks"
#: Format, fixture (``None``: exported here), the framework inspect names, the extra it needs.
CASES = [
    ("gguf", "gguf/llama_mixed.gguf", "gguf", "gguf"),
    ("onnx", None, "onnx", None),
    ("keras", "keras/cnn.keras", "keras 3", "h5py"),
    ("keras", "keras/tf_bert/tf_model.h5", "tf.keras (legacy HDF5)", "h5py"),
    ("flax", "flax/scan.msgpack", "flax", None),
    ("orbax", "orbax/nnx/7", "orbax", "tensorstore"),
    ("mlx", "mlx/llama_modes", "mlx", None),
]
IDS = ["gguf", "onnx", "keras", "tf_model.h5", "flax", "orbax", "mlx"]
#: Stored quantization, as inspect states it.
QUANTIZED = {"gguf": "quantization", "mlx": "dequantized"}
#: Modules torchgraft must never import, whatever it reads.
FRAMEWORKS = ("tensorflow", "tf_keras", "keras", "jax", "jaxlib", "flax", "orbax", "mlx")


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnx")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 4 * 4, 2, bias=False))
    path = tmp_path_factory.mktemp("onnx") / "net.onnx"
    torch.onnx.export(net.eval(), (torch.randn(1, 3, 6, 6),), str(path), dynamo=False)
    return path


def _path(fixture: str | None, extra: str | None, onnx_file: Path) -> Path:
    if extra is not None:
        pytest.importorskip(extra)
    return onnx_file if fixture is None else FIXTURES / fixture


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("fmt", "fixture", "framework", "extra"), CASES, ids=IDS)
def test_inspect_shows_framework_dtype_and_quantization(
        fmt: str, fixture: str | None, framework: str, extra: str | None,
        onnx_file: Path) -> None:
    info = tg.inspect(_path(fixture, extra, onnx_file))
    assert info.format == fmt
    metadata = info.extras["__metadata__"]
    assert metadata["framework"] == framework
    assert set(info.by_dtype) >= {"float32"}
    if fmt in QUANTIZED:
        assert metadata[QUANTIZED[fmt]]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
@pytest.mark.parametrize(("fmt", "fixture", "framework", "extra"), CASES, ids=IDS)
def test_convert_writes_the_values_read(tmp_path: Path, suffix: str, fmt: str,
                                        fixture: str | None, framework: str,
                                        extra: str | None, onnx_file: Path) -> None:
    source = _path(fixture, extra, onnx_file)
    out = tmp_path / f"converted{suffix}"
    tg.convert(source, out)
    written = tg.load(out)
    read = tg.load(source)
    assert set(written) == set(read)
    for name, tensor in read.items():
        assert torch.equal(written[name], tensor), name


_NO_FRAMEWORKS = """
import importlib.abc, json, pkgutil, sys, traceback
import torchgraft

BLOCKED = tuple(sys.argv[1].split(","))
PACKAGE = torchgraft.__path__[0]
attempts = []

class Recorder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            frames = [f for f in traceback.extract_stack()[:-1]
                      if "importlib" not in f.filename and f.filename != "<string>"]
            if frames and frames[-1].filename.startswith(PACKAGE):
                attempts.append([name, frames[-1].filename, frames[-1].lineno])
        return None

sys.meta_path.insert(0, Recorder())
for module in pkgutil.walk_packages(torchgraft.__path__, "torchgraft."):
    if module.name != "torchgraft.__main__":
        __import__(module.name)
for path in sys.argv[2:]:
    for tensor in torchgraft.load(path).values():
        tensor.sum()
print(json.dumps({"attempts": attempts,
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)}))
"""


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchgraft_never_imports_tensorflow_jax_or_mlx(onnx_file: Path) -> None:
    """Every torchgraft module imported and every framework fixture read, in a fresh process:
    no attempt from torchgraft's code to import any of those frameworks."""
    paths = [str(_path(fixture, extra, onnx_file)) for _, fixture, _, extra in CASES]
    env = {**os.environ, "PYTHONPATH": str(Path(tg.__file__).parent.parent)}
    result = subprocess.run([sys.executable, "-c", _NO_FRAMEWORKS, ",".join(FRAMEWORKS),
                             *paths], capture_output=True, text=True, env=env, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found == {"attempts": [], "loaded": []}


@pytest.mark.parametrize(("fixture", "package", "extra"), [
    ("keras/cnn.keras", "h5py", "keras"),
    ("gguf/llama_mixed.gguf", "gguf", "gguf"),  # its quantized tensors; F32/F16 need nothing
    ("orbax/cnn", "tensorstore", "orbax"),
])
def test_a_missing_light_reader_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                       fixture: str, package: str,
                                                       extra: str) -> None:
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(tg.MissingDependencyError, match=rf"needs '{package}'.*setup\.sh {extra}"):
        tg.load(FIXTURES / fixture)
