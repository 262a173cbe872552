"""ONNX models written by torch.onnx.export, read back into their PyTorch classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.helpers import BOUNDED, assert_scales_linearly, calls
from torchgraft.bounds import MAX_NESTING
from torchgraft.errors import CorruptCheckpointError, OutsideCheckpointError, TorchgraftError

onnx = pytest.importorskip("onnx")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Net(nn.Module):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.emb = nn.Embedding(10, 8)
        self.norm = nn.LayerNorm(8)
        self.encoder = nn.Sequential(nn.Linear(8, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 4, bias=False)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        y = self.conv(x).mean((2, 3)) + self.emb(ids)
        return self.head(self.encoder(self.norm(y)))


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([1, 7])


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Net, Path]:
    torch.manual_seed(0)
    model = Net().eval()
    path = tmp_path_factory.mktemp("onnx") / "net.onnx"
    torch.onnx.export(model, _inputs(), str(path), dynamo=False)
    return model, path


def test_legacy_export_grafts_back_with_recovered_names(exported: tuple[Net, Path]) -> None:
    model, path = exported
    info = tg.inspect(path)
    assert info.format == "onnx"
    # The bias-free Linear was exported as a MatMul on a transposed copy, 'onnx::MatMul_N'.
    renamed = info.extras["__metadata__"]["renamed_from_graph"]
    assert list(renamed) == ["head.weight"] and renamed["head.weight"].startswith("onnx::MatMul")
    target = Net()
    report = tg.graft(path, target)
    assert report.ok, report
    with torch.no_grad():
        torch.testing.assert_close(target(*_inputs()), model(*_inputs()), rtol=0, atol=0)


def test_external_data_is_read_by_offset(tmp_path: Path, exported: tuple[Net, Path]) -> None:
    model, path = exported
    proto = onnx.load(str(path))
    out = tmp_path / "external.onnx"
    onnx.save_model(proto, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    target = Net()
    assert tg.graft(out, target).ok
    with torch.no_grad():
        torch.testing.assert_close(target(*_inputs()), model(*_inputs()), rtol=0, atol=0)
    converted = tmp_path / "net.safetensors"
    tg.convert(out, converted)
    assert set(tg.load(converted)) == set(Net().state_dict())


@pytest.mark.slow
def test_dynamo_export_with_external_data_grafts_back(tmp_path: Path) -> None:
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = Net().eval()
    path = tmp_path / "dynamo.onnx"
    torch.onnx.export(model, _inputs(), str(path), dynamo=True, external_data=True)
    assert (tmp_path / "dynamo.onnx.data").is_file()
    target = Net()
    assert tg.graft(path, target).ok
    with torch.no_grad():
        torch.testing.assert_close(target(*_inputs()), model(*_inputs()), rtol=0, atol=0)


def test_another_width_is_never_ok(exported: tuple[Net, Path]) -> None:
    assert not tg.graft(exported[1], Net(hidden=32), strict=False).ok


def _external(tmp_path: Path, exported: tuple[Net, Path], **entries: str) -> Path:
    proto = onnx.load(str(exported[1]))
    weight = next(t for t in proto.graph.initializer if t.name == "conv.weight")
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    for key, value in entries.items():
        item = weight.external_data.add()
        item.key, item.value = key, value
    path = tmp_path / "model.onnx"
    onnx.save_model(proto, str(path))
    (tmp_path / "w.bin").write_bytes(bytes(100))
    return path


def test_external_data_outside_the_folder_is_refused(tmp_path: Path,
                                                      exported: tuple[Net, Path]) -> None:
    with pytest.raises(OutsideCheckpointError):
        tg.open(_external(tmp_path, exported, location="../../etc/passwd"))


@pytest.mark.parametrize("entries", [
    {"location": "w.bin", "offset": str(2**40), "length": "864"},
    {"location": "w.bin", "length": "864"},
    {"location": "missing.bin"},
])
def test_external_data_past_the_end_is_an_error(tmp_path: Path, exported: tuple[Net, Path],
                                                entries: dict[str, str]) -> None:
    with pytest.raises(CorruptCheckpointError):
        tg.open(_external(tmp_path, exported, **entries))


def test_dims_claiming_2_to_the_40_elements_are_an_error(tmp_path: Path,
                                                          exported: tuple[Net, Path]) -> None:
    proto = onnx.load(str(exported[1]))
    weight = next(t for t in proto.graph.initializer if t.name == "conv.weight")
    weight.dims[:] = [2**20, 2**20]
    path = tmp_path / "huge.onnx"
    onnx.save_model(proto, str(path))
    def refused() -> None:
        with pytest.raises(CorruptCheckpointError, match="conv.weight"):
            tg.open(path)

    assert calls(refused) < BOUNDED


def test_truncated_and_garbage_files_are_errors(tmp_path: Path,
                                                exported: tuple[Net, Path]) -> None:
    data = exported[1].read_bytes()
    for cut in (20, len(data) // 2, len(data) - 3):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        with pytest.raises(TorchgraftError):
            tg.load(path)
    bomb = tmp_path / "bomb.onnx"  # a field claiming 2^62 bytes
    bomb.write_bytes(b"\x08\x07\x3a" + b"\xff" * 8 + b"\x3f")
    with pytest.raises(CorruptCheckpointError):
        tg.open(bomb)


class Branchy(nn.Module):
    """Control flow that TorchScript keeps: an ``if`` (ONNX If) and a ``for`` (ONNX Loop)."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.a = nn.Linear(4, hidden, bias=False)
        self.b = nn.Linear(4, hidden)
        self.c = nn.Linear(hidden, hidden, bias=False)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):  # noqa: SIM108 (an if statement, as users write it)
            y = self.a(x)
        else:
            y = self.b(x)
        for _ in range(x.shape[0]):
            y = y + torch.tanh(self.c(y))
        return self.head(y)  # type: ignore[no-any-return]


def test_scripted_control_flow_grafts_back_through_its_subgraphs(tmp_path: Path) -> None:
    """The bias-free Linears used only inside the If and Loop bodies are exported as
    transposed copies with numeric names; only the subgraphs' nodes say what they are."""
    torch.manual_seed(0)
    model = Branchy().eval()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    path = tmp_path / "branchy.onnx"
    torch.onnx.export(torch.jit.script(model), (x,), str(path), dynamo=False)
    graph = onnx.load(str(path)).graph
    assert {n.op_type for n in graph.node} >= {"If", "Loop"}
    renamed = tg.inspect(path).extras["__metadata__"]["renamed_from_graph"]
    assert set(renamed) == {"a.weight", "c.weight"}
    target = Branchy()
    report = tg.graft(path, target)
    assert report.ok, report
    with torch.no_grad():
        for sign in (1, -1):  # both branches
            torch.testing.assert_close(target(sign * x.abs()), model(sign * x.abs()), rtol=0,
                                       atol=0)
    assert not tg.graft(path, Branchy(hidden=6), strict=False).ok


class CondNet(nn.Module):
    """``torch.cond``: the dynamo exporter's If, whose branches use the main graph's weights."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, self.a, self.b, (x,))  # type: ignore[no-any-return]


@pytest.mark.slow
def test_dynamo_export_of_torch_cond_grafts_back(tmp_path: Path) -> None:
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = CondNet().eval()
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(4))
    path = tmp_path / "cond.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=True)
    assert "If" in {n.op_type for n in onnx.load(str(path)).graph.node}
    target = CondNet()
    report = tg.graft(path, target)
    assert report.ok, report
    with torch.no_grad():
        for sign in (1, -1):
            torch.testing.assert_close(target(sign * x.abs()), model(sign * x.abs()), rtol=0,
                                       atol=0)

class Switch(nn.Module):
    """``then_proj(x)`` or ``loop_proj(loop_proj(else_proj(x)))``, as the ONNX graph below."""

    def __init__(self, width: int = 3) -> None:
        super().__init__()
        self.then_proj = nn.Linear(4, width, bias=False)
        self.else_proj = nn.Linear(4, width)
        self.loop_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, flag: bool) -> torch.Tensor:
        if flag:
            return self.then_proj(x)  # type: ignore[no-any-return]
        return self.loop_proj(self.loop_proj(self.else_proj(x)))  # type: ignore[no-any-return]


def _switch_graph(model: Switch) -> onnx.ModelProto:
    """An If whose branches hold their own initializers, one in a Loop body (depth 2): a
    transposed MatMul weight under a name of its own, Gemm weights under PyTorch's names."""
    from onnx import TensorProto, helper, numpy_helper

    def init(name: str, tensor: torch.Tensor) -> onnx.TensorProto:
        return numpy_helper.from_array(tensor.detach().numpy(), name)

    def value(name: str, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
        shape = [2, model.loop_proj.out_features] if elem == TensorProto.FLOAT else []
        return helper.make_tensor_value_info(name, elem, shape)

    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W_7"], ["t"], name="/then_proj/MatMul")],
        "then", [], [value("t")], [init("W_7", model.then_proj.weight.t().contiguous())])
    body = helper.make_graph(
        [helper.make_node("Gemm", ["y_in", "loop_proj.weight", "loop_proj.bias"], ["y_out"],
                          name="/loop_proj/Gemm", transB=1),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [value("i", TensorProto.INT64), value("cond_in", TensorProto.BOOL),
                 value("y_in")], [value("cond_out", TensorProto.BOOL), value("y_out")],
        [init("loop_proj.weight", model.loop_proj.weight),
         init("loop_proj.bias", model.loop_proj.bias)])
    other = helper.make_graph(
        [helper.make_node("Gemm", ["x", "else_proj.weight", "else_proj.bias"], ["e"],
                          name="/else_proj/Gemm", transB=1),
         helper.make_node("Loop", ["trips", "", "e"], ["l"], body=body)],
        "else", [], [value("l")],
        [init("else_proj.weight", model.else_proj.weight),
         init("else_proj.bias", model.else_proj.bias),
         numpy_helper.from_array(np.array(2, dtype=np.int64), "trips")])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["out"], then_branch=then, else_branch=other)],
        "switch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                   helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [value("out")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("width", [3, 512])  # 512: the If node holds 1 MiB, walked in place
def test_initializers_inside_if_and_loop_bodies_graft_with_onnxruntime_outputs(
        tmp_path: Path, width: int) -> None:
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = Switch(width).eval()
    path = tmp_path / "switch.onnx"
    onnx.save_model(_switch_graph(model), str(path))
    onnx.checker.check_model(str(path), full_check=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    info = tg.inspect(path)
    assert info.extras["__metadata__"]["renamed_from_graph"] == {"then_proj.weight": "W_7"}
    assert info.extras["__metadata__"]["constants_left_out"] == ["trips"]
    target = Switch(width)
    report = tg.graft(path, target)
    assert report.ok, report
    for name, tensor in model.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name
    with torch.no_grad():
        for flag in (True, False):
            expected = session.run(None, {"x": x, "flag": np.array(flag)})[0]
            # onnxruntime's kernels sum in their own order: measured 4.6e-7 (outputs up to 2.3).
            np.testing.assert_allclose(target(torch.from_numpy(x), flag).numpy(), expected,
                                       rtol=1e-5, atol=1e-5)
    assert not tg.graft(path, Switch(width + 2), strict=False).ok


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    length, size = bytearray(), len(payload)
    while True:
        length.append((size & 0x7F) | (0x80 if size > 0x7F else 0))
        size >>= 7
        if not size:
            break
    return bytes([number << 3 | 2]) + bytes(length) + payload


def test_a_nesting_bomb_of_subgraphs_is_refused_in_bounded_time(tmp_path: Path) -> None:
    node = _field(4, b"Identity")
    for _ in range(2000):  # If { then_branch: graph { If { ... } } }, 2,000 deep
        graph = _field(1, node)
        node = _field(4, b"If") + _field(5, _field(1, b"then_branch") + b"\x20\x05"
                                         + _field(6, graph))
    bomb = tmp_path / "bomb.onnx"
    bomb.write_bytes(b"\x08\x08" + _field(7, _field(1, node)))
    def refused() -> None:
        with pytest.raises(CorruptCheckpointError, match=f"nest deeper than {MAX_NESTING}"):
            tg.open(bomb)

    assert calls(refused) < BOUNDED


def _identity_chain(path: Path, count: int, *, role: str = "Relu") -> None:
    """A graph of ``count`` initializers, each entering one Identity chain (onnx.helper)."""
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    initializers, nodes, previous = [], [], "x"
    for k in range(count):
        initializers.append(numpy_helper.from_array(np.full((1,), k, np.float32), f"w{k}"))
        nodes.append(helper.make_node("Identity", [previous, f"w{k}"], [f"c{k}"],
                                      name=f"/chain/Identity_{k}"))
        previous = f"c{k}"
    nodes.append(helper.make_node(role, [previous, "x"][:2 if role == "Add" else 1], ["y"],
                                  name="/out/" + role))
    value = onnx.TensorProto.FLOAT
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", value, [1])],
                              [helper.make_tensor_value_info("y", value, [1])],
                              initializer=initializers)
    onnx.save(helper.make_model(graph), str(path))


def test_identity_chains_are_walked_in_linear_time(tmp_path: Path) -> None:
    def cost(count: int) -> int:
        path = tmp_path / f"chain{count}.onnx"
        _identity_chain(path, count)  # every walk from an initializer ran to the chain's end
        return calls(lambda: tg.open(path).close())

    assert_scales_linearly(cost, 1500)


def test_a_weight_used_through_an_identity_copy_is_named_by_its_use(tmp_path: Path) -> None:
    path = tmp_path / "copy.onnx"
    _identity_chain(path, 1, role="Add")  # w0 -> Identity -> c0 -> /out/Add (slot 0: a bias)
    with tg.open(path) as ckpt:
        assert ckpt.keys() == ["out.bias"]
        assert ckpt.extras["__metadata__"]["renamed_from_graph"] == {"out.bias": "w0"}
