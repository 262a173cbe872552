"""Grafting other frameworks' files vs each framework's own loader plus a manual conversion.

For each format a model of ``N x Linear(1024, 1024)`` without bias (1 GiB of float32 for
N = 256, layers named ``l0``, ``l1``...) is written by the framework itself, then loaded in
fresh processes, sides alternated, the file in the page cache before each run:

- ours: ``tg.graft(file, model)`` into the built PyTorch model (torchgraft's venv);
- theirs: what an expert does with the framework installed, in the framework's own venv:
  Keras ``load_weights`` + kernels transposed to contiguous ``[out, in]`` arrays; Flax
  ``serialization.msgpack_restore`` + the same transposes; Orbax (a folder written by
  ``StandardCheckpointer().save``: OCDBT, zarr v2 chunks) ``StandardCheckpointer().restore``
  to JAX arrays + the same transposes to numpy; gguf-py's ``GGUFReader`` (+
  ``gguf.quants.dequantize`` for Q8_0) into ``load_state_dict``; ``onnx.load`` +
  ``numpy_helper.to_array`` + transposes into ``load_state_dict``; MLX ``mx.load`` +
  ``mx.dequantize`` (in the mode, bits and group size the folder's config.json gives) to
  float32 numpy, for mlx-lm folders quantized in each MLX mode: ``mlx`` (affine, 4 bits,
  groups of 64), ``mlx-mxfp4``, ``mlx-mxfp8`` (groups of 32) and ``mlx-nvfp4`` (groups of
  16).

The framework venvs have no torch: their side ends at contiguous numpy arrays in PyTorch's
layout, one copy of the weights, which is less work than filling a model. Both sides
checksum every weight (float64 sums) and must agree. Peak RSS is each process's high-water
mark; "physical" is the time to read the file once from the page cache.

Run: python bench/frameworks.py [--mib 1024] [--repeat 2] [--formats gguf,onnx,...] [--json]
(framework pythons from TG_KERAS_PYTHON, TG_FLAX_PYTHON (also Orbax's), TG_MLX_PYTHON (every
MLX mode); default /work/venvs/{tf,jax,mlx}/bin/python; a format whose python is missing is
reported as not measured).
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/inspect.py would shadow the standard library's inspect (imported by torch).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from functools import partial  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

_WIDTH = 1024
_PYTHONS = {"keras": ("TG_KERAS_PYTHON", "/work/venvs/tf/bin/python"),
            "flax": ("TG_FLAX_PYTHON", "/work/venvs/jax/bin/python"),
            "orbax": ("TG_FLAX_PYTHON", "/work/venvs/jax/bin/python"),
            "mlx": ("TG_MLX_PYTHON", "/work/venvs/mlx/bin/python")}
#: MLX's quantization modes benchmarked: format -> (mode, bits, group size).
_MLX_MODES = {"mlx": ("affine", 4, 64), "mlx-mxfp4": ("mxfp4", 4, 32),
              "mlx-mxfp8": ("mxfp8", 8, 32), "mlx-nvfp4": ("nvfp4", 4, 16)}
_FILES = {"gguf": "model.gguf", "gguf-q8_0": "model-q8_0.gguf", "onnx": "model.onnx",
          "keras": "model.weights.h5", "flax": "model.msgpack", "orbax": "orbax",
          **{fmt: f"mlx-{mode}" for fmt, (mode, _, _) in _MLX_MODES.items()}}


def _framework(fmt: str) -> str:
    """The framework whose venv writes and loads ``fmt`` (``mlx-mxfp4`` -> ``mlx``)."""
    return fmt.split("-")[0]


def _python(fmt: str) -> str:
    env, default = _PYTHONS.get(_framework(fmt), ("", sys.executable))
    return os.environ.get(env, default) if env else sys.executable


def _weights(layers: int) -> list[Any]:
    """The same random ``[out, in]`` float32 weights for every format (fixed seed)."""
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((_WIDTH, _WIDTH), dtype=np.float32) * 0.02)
            for _ in range(layers)]


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _sum(arrays: list[Any]) -> float:
    return float(sum(float(np.asarray(a, dtype=np.float64).sum()) for a in arrays))


# --- writers (each in its framework's python) -----------------------------------------------

def write_gguf(path: Path, layers: int, quantized: bool = False) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "generic")
    for i, weight in enumerate(_weights(layers)):
        if quantized:
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(f"l{i}.weight", gguf.quants.quantize(weight, qtype),
                              raw_dtype=qtype)
        else:
            writer.add_tensor(f"l{i}.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_onnx(path: Path, layers: int) -> None:
    import torch

    model = _torch_model(layers, names=True)
    with torch.no_grad():
        for linear, weight in zip(model, _weights(layers), strict=True):
            linear.weight.copy_(torch.from_numpy(weight))
    torch.onnx.export(model, (torch.zeros(1, _WIDTH),), str(path), dynamo=False)


def write_keras(path: Path, layers: int) -> None:
    model = _keras_model(layers)
    for layer, weight in zip(model.layers, _weights(layers), strict=True):
        layer.kernel.assign(weight.T)
    model.save_weights(str(path))


def _flax_variables(layers: int) -> dict[str, Any]:
    """Flax's variables for the model: ``params/l<i>/kernel`` in ``[in, out]``."""
    return {"params": {f"l{i}": {"kernel": np.ascontiguousarray(w.T)}
                       for i, w in enumerate(_weights(layers))}}


def write_flax(path: Path, layers: int) -> None:
    from flax import serialization

    path.write_bytes(serialization.to_bytes(_flax_variables(layers)))


def write_orbax(path: Path, layers: int) -> None:
    import jax
    import orbax.checkpoint as ocp

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, jax.tree.map(jax.numpy.asarray, _flax_variables(layers)))
    checkpointer.wait_until_finished()
    checkpointer.close()


def write_mlx(path: Path, layers: int, fmt: str = "mlx") -> None:
    import mlx.core as mx

    mode, bits, group = _MLX_MODES[fmt]
    path.mkdir()
    tensors = {}
    for i, weight in enumerate(_weights(layers)):
        packed, scales, *biases = mx.quantize(mx.array(weight), group_size=group, bits=bits,
                                              mode=mode)
        tensors.update({f"l{i}.weight": packed, f"l{i}.scales": scales})
        tensors.update({f"l{i}.biases": b for b in biases if b is not None})
    mx.save_safetensors(str(path / "model.safetensors"), tensors, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps({"quantization": {
        "group_size": group, "bits": bits, "mode": mode}}))


# --- theirs (each in its framework's python): prepare (untimed), then load ------------------

def _torch_model(layers: int, names: bool = False) -> Any:
    from collections import OrderedDict

    from torch import nn

    return nn.Sequential(OrderedDict((f"l{i}" if names else str(i),
                                      nn.Linear(_WIDTH, _WIDTH, bias=False))
                                     for i in range(layers)))


def _keras_model(layers: int) -> Any:
    import keras

    return keras.Sequential([keras.Input((_WIDTH,))] + [
        keras.layers.Dense(_WIDTH, use_bias=False, name=f"l{i}") for i in range(layers)])


def theirs_gguf(path: Path, model: Any) -> list[Any]:
    import gguf
    import torch

    reader = gguf.GGUFReader(str(path))
    state = {}
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in tensor.shape[::-1])
        data = tensor.data
        if tensor.tensor_type != gguf.GGMLQuantizationType.F32:
            data = gguf.quants.dequantize(data, tensor.tensor_type)
        state[tensor.name] = torch.from_numpy(np.ascontiguousarray(data).reshape(shape))
    model.load_state_dict(state)
    return [p.detach().numpy() for p in model.parameters()]


def theirs_onnx(path: Path, model: Any) -> list[Any]:
    import onnx
    import torch
    from onnx import numpy_helper

    proto = onnx.load(str(path))
    arrays = [numpy_helper.to_array(t) for t in proto.graph.initializer]
    model.load_state_dict({f"l{i}.weight": torch.from_numpy(np.ascontiguousarray(a.T))
                           for i, a in enumerate(arrays)})
    return [p.detach().numpy() for p in model.parameters()]


def theirs_keras(path: Path, model: Any) -> list[Any]:
    model.load_weights(str(path))
    return [np.ascontiguousarray(np.asarray(layer.kernel).T) for layer in model.layers]


def theirs_flax(path: Path, layers: int) -> list[Any]:
    from flax import serialization

    state = serialization.msgpack_restore(path.read_bytes())
    return _transposed(state, layers)


def theirs_orbax(path: Path, layers: int) -> list[Any]:
    import orbax.checkpoint as ocp

    return _transposed(ocp.StandardCheckpointer().restore(path), layers)


def _transposed(variables: Any, layers: int) -> list[Any]:
    """Flax's ``[in, out]`` kernels as contiguous ``[out, in]`` numpy arrays."""
    return [np.ascontiguousarray(np.asarray(variables["params"][f"l{i}"]["kernel"]).T)
            for i in range(layers)]


def theirs_mlx(path: Path, layers: int) -> list[Any]:
    import mlx.core as mx

    claim = json.loads((path / "config.json").read_text())["quantization"]
    tensors = mx.load(str(path / "model.safetensors"))
    return [np.array(mx.dequantize(tensors[f"l{i}.weight"], tensors[f"l{i}.scales"],
                                   tensors.get(f"l{i}.biases"), group_size=claim["group_size"],
                                   bits=claim["bits"], mode=claim["mode"]).astype(mx.float32))
            for i in range(layers)]


def ours(path: Path, model: Any) -> list[Any]:
    import torchgraft as tg

    report = tg.graft(path, model, strict=True)
    assert report.ok, report
    return [p.detach().numpy() for p in model.parameters()]


_WRITERS: dict[str, Callable[[Path, int], None]] = {
    "gguf": write_gguf, "gguf-q8_0": lambda p, n: write_gguf(p, n, quantized=True),
    "onnx": write_onnx, "keras": write_keras, "flax": write_flax, "orbax": write_orbax,
    **{fmt: partial(write_mlx, fmt=fmt) for fmt in _MLX_MODES}}
_THEIRS: dict[str, Callable[[Path, Any], list[Any]]] = {
    "gguf": theirs_gguf, "gguf-q8_0": theirs_gguf, "onnx": theirs_onnx, "keras": theirs_keras,
    "flax": theirs_flax, "orbax": theirs_orbax, **dict.fromkeys(_MLX_MODES, theirs_mlx)}
#: What each side imports and builds before the clock starts (by framework).
_MODULES = {"ours": ("torch", "torchgraft", "torchgraft.graft"), "gguf": ("torch", "gguf"),
            "onnx": ("torch", "onnx"), "keras": ("keras",), "flax": ("flax.serialization",),
            "orbax": ("orbax.checkpoint",), "mlx": ("mlx.core",)}
#: Optional dependencies torchgraft's readers import (imported before the clock too).
_OURS_EXTRA = {"keras": ("h5py",), "gguf-q8_0": ("gguf",), "orbax": ("tensorstore",)}


def _prepare(side: str, fmt: str, layers: int) -> Any:
    wanted = (_MODULES["ours"] + _OURS_EXTRA.get(fmt, ()) if side == "ours"
              else _MODULES[_framework(fmt)])
    for module in wanted:
        __import__(module)
    if side == "ours" or fmt in ("gguf", "gguf-q8_0", "onnx"):
        return _torch_model(layers, names=True)
    return _keras_model(layers) if fmt == "keras" else layers


def _worker(side: str, fmt: str, path: Path, layers: int) -> None:
    if side == "write":
        _WRITERS[fmt](path, layers)
        print(json.dumps({}))
        return
    prepared = _prepare(side, fmt, layers)
    start = time.perf_counter()
    arrays = ours(path, prepared) if side == "ours" else _THEIRS[fmt](path, prepared)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_rss": _peak(), "checksum": _sum(arrays)}))


def _run(python: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([python, __file__, "--worker", *args], check=True, capture_output=True,
                         text=True, env=env, cwd=tempfile.gettempdir())
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _warm(path: Path) -> float:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    start = time.perf_counter()
    for file in files:
        with file.open("rb") as f:
            while f.read(1 << 24):
                pass
    return time.perf_counter() - start


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(
        p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(fmt: str, folder: Path, layers: int, repeat: int) -> dict[str, Any]:
    python = _python(fmt)
    if not Path(python).exists():
        return {"format": fmt, "not_measured": f"no framework python at {python}"}
    path = folder / _FILES[fmt]
    _run(python, "write", fmt, str(path), str(layers))
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "theirs": []}
    physical = []
    for _ in range(repeat):
        for side in ("ours", "theirs"):
            physical.append(_warm(path))
            runs[side].append(_run(sys.executable if side == "ours" else python, side, fmt,
                                   str(path), str(layers)))
    sums = {round(r["checksum"], 3) for side in runs.values() for r in side}
    result: dict[str, Any] = {
        "format": fmt, "file_mib": round(_size(path) / 2**20), "weights_mib": layers * 4,
        "checksums_agree": len(sums) == 1, "physical_read_s": round(min(physical), 3),
    }
    for side, values in runs.items():
        result[f"{side}_s"] = round(statistics.median(r["seconds"] for r in values), 3)
        result[f"{side}_peak_mib"] = round(statistics.median(r["peak_rss"] for r in values)
                                           / 2**20)
    result["time_ratio"] = round(statistics.median(
        a["seconds"] / b["seconds"] for a, b in zip(runs["ours"], runs["theirs"], strict=True)),
        3)
    result["rss_ratio"] = round(result["ours_peak_mib"] / result["theirs_peak_mib"], 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, metavar=("SIDE", "FORMAT", "PATH", "LAYERS"))
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--formats", default=",".join(_FILES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.worker:
        side, fmt, path, layers = args.worker
        _worker(side, fmt, Path(path), int(layers))
        return
    layers = max(1, args.mib // 4)
    results = []
    for fmt in args.formats.split(","):
        with tempfile.TemporaryDirectory(dir=os.environ.get("TG_BENCH_DIR")) as folder:
            results.append(measure(fmt, Path(folder), layers, args.repeat))
        if not args.json:
            print(json.dumps(results[-1]))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
