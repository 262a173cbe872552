"""The reversible operations: every kind undone bit for bit by its inverse, lazily too."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torchgraft.errors import TorchgraftError
from torchgraft.graft.layouts import ops
from torchgraft.meta import TensorMeta, TensorRef


def _ref(tensor: torch.Tensor) -> TensorRef:
    return TensorRef(TensorMeta.of(tuple(tensor.shape), tensor.dtype), lambda: tensor)


def _t(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


CASES = [
    (ops.Concatenate(0), [_t(8, 4), _t(2, 4), _t(2, 4)]),
    (ops.Concatenate(-1), [_t(3, 2), _t(3, 5)]),
    (ops.Split(0, sizes=(8, 2, 2)), [_t(12, 4)]),
    (ops.Split(1, count=3), [_t(2, 9)]),
    (ops.Interleave((4, 4, 4)), [_t(8, 3), _t(8, 3), _t(8, 3)]),
    (ops.Interleave((8, 2, 2)), [_t(16, 3), _t(4, 3), _t(4, 3)]),  # GQA: 2 kv groups
    (ops.Deinterleave((8, 2, 2)), [_t(24, 3)]),
    (ops.Transpose(0, 1), [_t(3, 5)]),
    (ops.Permute((2, 0, 1)), [_t(2, 3, 4)]),
    (ops.RotaryRows(4, to_halves=True), [_t(8, 3)]),
    (ops.RotaryRows(4, to_halves=False, rows=8), [_t(12, 3)]),  # q, k of a fused [Q; K; V]
    (ops.Stack(0), [_t(2, 3), _t(2, 3)]),
    (ops.Unstack(1), [_t(2, 3, 4)]),
    (ops.Reshape((6, 4)), [_t(6, 4, 1, 1)]),
    (ops.Offset(1.0), [_t(5)]),
    (ops.Reverse(0, 2), [_t(6, 3)]),
    (ops.WeightNormSplit(0, (6, 1, 1)), [_t(6, 4, 3)]),
    (ops.Chain((ops.Concatenate(0), ops.Transpose(0, 1))), [_t(2, 3), _t(4, 3)]),
]


@pytest.mark.parametrize(("op", "inputs"), CASES, ids=lambda c: type(c).__name__)
def test_inverse_gives_the_inputs_back(op: ops.TensorOp, inputs: list[torch.Tensor]) -> None:
    shapes = [tuple(t.shape) for t in inputs]
    out = op.apply(inputs)
    assert [tuple(t.shape) for t in out] == op.shapes(shapes)
    back = op.inverse(shapes).apply(out)
    assert len(back) == len(inputs)
    for got, want in zip(back, inputs, strict=True):
        exact = not isinstance(op, (ops.Offset, ops.WeightNormSplit))  # (w + 1) - 1 rounds
        assert torch.equal(got, want) if exact else torch.allclose(got, want, atol=1e-6)
    assert op.describe()
    assert type(op) in ops.KINDS.values()


def test_rotary_rows_are_the_transformers_conversion_permute() -> None:
    # transformers' convert_llama_weights_to_hf.py: permute(w, n_heads, dim1, dim2)
    heads, dim1, dim2 = 2, 8, 3
    w = _t(dim1, dim2)
    theirs = w.view(heads, dim1 // heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)
    assert torch.equal(ops.RotaryRows(dim1 // heads, to_halves=True).apply([w])[0], theirs)
    wrong = ops.RotaryRows(dim1, to_halves=True).apply([w])[0]  # another head count
    assert not torch.equal(wrong, theirs)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_weight_norm_is_torchs_and_its_split_gives_the_same_weight(dim: int) -> None:
    """The fold computes what ``torch.nn.utils.parametrizations.weight_norm`` computes; its
    inverse gives a magnitude and direction that fold back to the same weight (``g = ||w||``,
    not the trained ``g``: another parametrization of one weight)."""
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(4, 6, 3),
                                                       dim=None if dim == -1 else dim)
    g = conv.parametrizations.weight.original0.detach()
    v = conv.parametrizations.weight.original1.detach() * 3  # ||v|| != g
    op = ops.WeightNorm(dim)
    [folded] = op.apply([g, v])
    assert torch.allclose(folded, torch._weight_norm(v, g, dim), atol=1e-6)
    g2, v2 = op.inverse([tuple(g.shape), tuple(v.shape)]).apply([folded])
    assert g2.shape == g.shape and not torch.allclose(v2, v)  # the weight, not the trained v
    assert torch.allclose(op.apply([g2, v2])[0], folded, atol=1e-6)


def test_interleave_is_gpt_neox_query_key_value() -> None:
    heads, hd, width = 2, 4, 3
    q, k, v = _t(heads * hd, width), _t(heads * hd, width), _t(heads * hd, width)
    fused = ops.Interleave((hd, hd, hd)).apply([q, k, v])[0]
    per_head = fused.view(heads, 3, hd, width)  # GPT-NeoX: [heads, (q, k, v), head_dim]
    assert torch.equal(per_head[:, 1].reshape(-1, width), k)
    assert not torch.equal(ops.Concatenate(0).apply([q, k, v])[0], fused)


@pytest.mark.parametrize(("op", "shapes"), [
    (ops.Concatenate(0), [(2, 3), (2, 4)]),
    (ops.Split(0, sizes=(2, 2)), [(5, 3)]),
    (ops.Split(0, count=3), [(4, 3)]),
    (ops.Interleave((4, 4)), [(8, 3), (4, 3)]),
    (ops.Deinterleave((4, 4)), [(12, 3)]),
    (ops.Transpose(0, 2), [(2, 3)]),
    (ops.Permute((0, 0)), [(2, 3)]),
    (ops.RotaryRows(3, to_halves=True), [(6, 2)]),
    (ops.RotaryRows(4, to_halves=True, rows=6), [(12, 2)]),
    (ops.RotaryRows(4, to_halves=True, rows=16), [(12, 2)]),
    (ops.Stack(0), [(2, 3), (3, 2)]),
    (ops.Reshape((5,)), [(2, 3)]),
    (ops.Offset(1.0), [(2,), (2,)]),
    (ops.Reverse(0, 2), [(5, 3)]),
    (ops.WeightNorm(0), [(6, 1, 1)]),
    (ops.WeightNorm(0), [(1, 6, 1), (6, 4, 3)]),
    (ops.WeightNormSplit(1, (6, 1, 1)), [(6, 4, 3)]),
])
def test_shapes_that_do_not_fit_are_refused(op: ops.TensorOp,
                                            shapes: list[tuple[int, ...]]) -> None:
    with pytest.raises(TorchgraftError, match="cannot .*shapes"):
        op.shapes(shapes)
    with pytest.raises(TorchgraftError):
        op.inverse(shapes)


def test_lazy_reads_nothing_until_asked_and_blocks_of_rows() -> None:
    reads: list[str] = []
    parts = {n: _t(4, 3) for n in "qkv"}

    def reader(name: str) -> torch.Tensor:
        reads.append(name)
        return parts[name]

    refs = [TensorRef(TensorMeta.of((4, 3), torch.float32), lambda n=n: reader(n),
                      read_box=lambda start, out, n=n: out.copy_(
                          parts[n][start[0]:start[0] + out.shape[0]]))
            for n in "qkv"]
    [fused] = ops.lazy(ops.Concatenate(0), refs)
    assert fused.meta.shape == (12, 3) and not reads
    block = torch.empty(4, 3)
    fused.read_box((4, 0), block)  # exactly k: through k's block reader, no whole read
    assert torch.equal(block, parts["k"]) and not reads
    assert torch.equal(fused.read(), torch.cat(list(parts.values())))
    k_again = ops.lazy(ops.Split(0, count=3), [fused])[1]
    assert torch.equal(k_again.read(), parts["k"])
    with pytest.raises(TorchgraftError, match="equal parts"):
        ops.lazy(ops.Split(0, count=5), [fused])


@pytest.mark.parametrize("make", [
    lambda: ops.Reshape((-1, -4)),  # the size of (4,), by products
    lambda: ops.Reshape((2, True)),
    lambda: ops.Reshape((1,) * 65),
    lambda: ops.Split(0, sizes=(-2, 6)),  # adds up to 4
    lambda: ops.Split(0, count=0),
    lambda: ops.Split(0, sizes=(2, 2), count=2),
    lambda: ops.Interleave((4, 0)),
    lambda: ops.Deinterleave(()),
    lambda: ops.RotaryRows(0, to_halves=True),
    lambda: ops.RotaryRows(4, to_halves=True, rows=-8),
    lambda: ops.Reverse(0, -2),
    lambda: ops.Offset(float("inf")),
    lambda: ops.WeightNormSplit(0, (-6, 1)),
], ids=["reshape negative", "reshape bool", "reshape 65 dims", "split negative", "split 0",
        "split sizes and count", "interleave 0", "deinterleave none", "rotary 0", "rotary rows",
        "reverse", "offset inf", "magnitude"])
def test_sizes_that_are_no_sizes_are_refused_as_the_operation_is_made(make: Any) -> None:
    with pytest.raises(TorchgraftError, match="must be|no tensor's|not both"):
        make()


def test_sizes_from_zero_or_one_are_operations() -> None:  # the controls
    assert ops.Reshape((3, 4)).shapes([(12,)]) == [(3, 4)]
    assert ops.Reshape((0, 4)).shapes([(0, 3)]) == [(0, 4)]  # an empty tensor's shape
    assert ops.Split(0, sizes=(1, 3)).shapes([(4, 2)]) == [(1, 2), (3, 2)]
    assert ops.Offset(-1).shapes([(3,)]) == [(3,)]
    with pytest.raises(TorchgraftError, match="does not split into 3"):  # no 0-row parts
        ops.Split(0, count=3).shapes([(0, 2)])
