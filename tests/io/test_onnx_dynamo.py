"""``torch.onnx.export(dynamo=True)`` files: what the graph says its initializers are.

The dynamo exporter folds a Linear applied to a 3-D input into a MatMul on a transposed copy
(``val_4``), and records in each node's metadata the module that ran it: the copy is named
and transposed back. What consumes an initializer says what it is: a table a ``Gather`` looks
rows up in (along axis 0) is an embedding, whatever its name or place. Each graft below is
from a bare file into another code base's model; each has a twin that is never ok.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchgraft as tg
from torchgraft.graft.evidence import Evidence

pytest.importorskip("onnxscript")

VOCAB, WIDTH = 24, 16


class Source(nn.Module):
    """One code base: a lookup table, a mixing Linear, a norm, a read-out of the table's shape.

    ``swapped`` gives the names to the other modules (the lookup is called ``readout``).
    """

    def __init__(self, *, swapped: bool = False) -> None:
        super().__init__()
        table: nn.Module = nn.Embedding(VOCAB, WIDTH)
        readout: nn.Module = nn.Linear(WIDTH, VOCAB, bias=False)
        self.table = readout if swapped else table
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.readout = table if swapped else readout
        self.swapped = swapped

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        lookup, out = (self.readout, self.table) if self.swapped else (self.table, self.readout)
        return out(self.norm(F.gelu(self.mix(lookup(ids)))))  # type: ignore[no-any-return]


class ByColumns(nn.Module):
    """A twin that computes something else: its table's columns are gathered (axis 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(WIDTH, VOCAB))
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.readout = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        looked_up = self.table[:, ids].permute(1, 2, 0)
        return self.readout(self.norm(F.gelu(self.mix(looked_up))))  # type: ignore[no-any-return]


class Target(nn.Module):
    """Another code base: the read-out defined first, every name another."""

    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(WIDTH, VOCAB, bias=False)
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.hidden = nn.Linear(WIDTH, WIDTH)
        self.ln = nn.LayerNorm(WIDTH)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(F.gelu(self.hidden(self.emb(ids)))))  # type: ignore[no-any-return]


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))


def _export(model: nn.Module, path: Path) -> Path:
    """Draw the model's parameters (N(0, 0.3), seed 0), then export it with dynamo."""
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(model.eval(), (_ids(),), str(path), dynamo=True)
    return path


def _same_outputs(model: nn.Module, source: nn.Module) -> None:
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(_ids()), source(_ids()), rtol=0, atol=1e-5)


def test_folded_linear_weights_are_named_by_their_module_and_tables_are_embeddings(
        tmp_path: Path) -> None:
    source = Source()
    path = _export(source, tmp_path / "source.onnx")
    with tg.open(path) as ckpt:
        renamed = ckpt.extras["__metadata__"]["renamed_from_graph"]
        assert set(renamed) == {"mix.weight", "readout.weight"}  # folded copies, named back
        assert ckpt.extras["__metadata__"]["kinds"] == {"table.weight": "embedding"}
        for key, value in source.state_dict().items():
            assert torch.equal(ckpt[key], value), key


def test_the_lookup_is_told_from_the_read_out_by_what_consumes_it(tmp_path: Path) -> None:
    """The two [24, 16] tensors: the model defines its read-out first, the file its table;
    the Gather says which is the embedding. Before: INCOMPLETE (the folded weights were left
    out as constants), and without the Gather's kind a guess, filled the wrong way round."""
    source = Source()
    model = Target()
    report = tg.graft(_export(source, tmp_path / "source.onnx"), model, strict=False)
    assert report.ok, report
    assert report.mapping["emb.weight"] == "table.weight"
    assert set(report.evidence.values()) == {Evidence.STRUCTURE}
    _same_outputs(model, source)


def test_the_consumer_wins_over_names_that_say_otherwise(tmp_path: Path) -> None:
    """The lookup named ``readout``, the read-out ``table``: the Gather still decides."""
    source = Source(swapped=True)
    model = Target()
    report = tg.graft(_export(source, tmp_path / "swapped.onnx"), model, strict=False)
    assert report.ok, report
    assert report.mapping["emb.weight"] == "readout.weight"
    _same_outputs(model, source)


def test_a_table_gathered_by_columns_is_no_embedding_and_never_ok(tmp_path: Path) -> None:
    """Its [16, 24] table is gathered along axis 1: not an embedding's lookup (its kind stays
    unknown), and it computes something the model cannot: never ok."""
    path = _export(ByColumns(), tmp_path / "columns.onnx")
    with tg.open(path) as ckpt:
        assert "table" not in ckpt.extras["__metadata__"]["kinds"]
    assert not tg.graft(path, Target(), strict=False).ok


def test_a_one_dimensional_table_is_no_embedding(tmp_path: Path) -> None:
    class Biased(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bias = nn.Parameter(torch.randn(VOCAB))
            self.emb = nn.Embedding(VOCAB, WIDTH)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.emb(ids) + self.bias[ids].unsqueeze(-1)  # type: ignore[no-any-return]

    path = _export(Biased(), tmp_path / "biased.onnx")
    with tg.open(path) as ckpt:
        assert ckpt.extras["__metadata__"]["kinds"] == {"emb.weight": "embedding"}


def test_scopes_that_would_name_two_initializers_alike_name_none(tmp_path: Path) -> None:
    """Two folded constants a scope would both call ``attn.weight``, and one a named
    initializer already has: constants, left out, never an error or a wrong name."""
    onnx = pytest.importorskip("onnx")
    helper, numpy_helper = onnx.helper, onnx.numpy_helper

    def matmul(name: str, x: str, weight: str, out: str, scope: str) -> object:
        node = helper.make_node("MatMul", [x, weight], [out], name=name)
        entry = node.metadata_props.add()
        entry.key, entry.value = "pkg.torch.onnx.name_scopes", f"['', '{scope}', '{name}']"
        return node

    arrays = {name: numpy_helper.from_array(torch.randn(4, 4).numpy(), name)
              for name in ("val_1", "val_2", "val_3", "fc.weight")}
    graph = helper.make_graph(
        [matmul("matmul", "x", "val_1", "y", "attn"),
         matmul("matmul_1", "y", "val_2", "z", "attn"),
         matmul("matmul_2", "z", "val_3", "w", "fc"),
         matmul("matmul_3", "w", "fc.weight", "v", "")],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("v", onnx.TensorProto.FLOAT, [1, 4])],
        list(arrays.values()))
    path = tmp_path / "scopes.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with tg.open(path) as ckpt:
        assert list(ckpt) == ["fc.weight"]
        assert set(ckpt.extras["__metadata__"]["constants_left_out"]) == {"val_1", "val_2",
                                                                         "val_3"}
