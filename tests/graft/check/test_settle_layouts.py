"""Settling tries every hypothesis the plan ranked: a fused layout read the wrong way too.

A fused ``wqkv`` is stored as ``[Q; K; V]`` blocks by gpt-fast and key/value group by group by
InternLM2: the name does not say which, so the graft reads blocks and guesses. Into an
InternLM2-style model, outputs diverge, and settling finds the grouped layout (and reports
what it tried); into a gpt-fast-style model the guess holds. The broken twin, a model whose
fused rows are in neither layout, stays diverged with every hypothesis listed as tried.
"""

from __future__ import annotations

import torch
from torch import nn

import torchgraft as tg
from tests.graft.layouts.test_fused_layouts import DIM, XB, GroupedSplit, _attend, _wrapped
from torchgraft.graft.evidence import Verdict


class Fused(nn.Module):
    """A fused ``wqkv``: ``[Q; K; V]`` blocks, key/value groups, or (twin) rows reversed."""

    def __init__(self, heads: int, kv_heads: int, layout: str) -> None:
        super().__init__()
        self.num_heads, self.num_key_value_heads = heads, kv_heads
        self.head_dim, self.layout = DIM // heads, layout
        self.wqkv = nn.Linear(DIM, (heads + 2 * kv_heads) * self.head_dim)
        self.wo = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        fused = self.wqkv(x)
        kv = self.num_key_value_heads * self.head_dim
        if self.layout == "groups":
            per_group = self.num_heads // self.num_key_value_heads
            grouped = fused.view(b, t, self.num_key_value_heads, per_group + 2, -1)
            q, k, v = (p.reshape(b, t, -1) for p in grouped.split([per_group, 1, 1], dim=3))
        else:
            if self.layout == "reversed":
                fused = fused.flip(-1)
            q, k, v = fused.split([DIM, kv, kv], dim=-1)
        return self.wo(_attend(q, k, v, self.num_heads, self.num_key_value_heads))


def _graft(layout: str) -> tuple[tg.GraftReport, nn.Module, nn.Module]:
    torch.manual_seed(11)
    source, target = _wrapped(GroupedSplit(4, 2)), _wrapped(Fused(4, 2, layout))
    report = tg.graft(source, target, example_inputs=(XB,))
    return report, source, target


def _same(target: nn.Module, source: nn.Module) -> bool:
    with torch.no_grad():
        return torch.allclose(target(XB), source(XB), atol=1e-5)


def test_a_grouped_fused_layout_read_as_blocks_is_settled() -> None:
    report, source, target = _graft("groups")
    assert report.verdict is Verdict.OK, str(report)
    assert _same(target, source)
    assert report.settled and "2 groups of [q; k; v] (16+8+8 rows each)" in report.settled[0]
    assert any(t.endswith("kept") for t in report.tried)
    assert "settled   'attention.wqkv' joined as" in str(report)


def test_blocks_need_no_settling() -> None:
    report, source, target = _graft("blocks")
    assert report.verdict is Verdict.OK and not report.settled
    assert _same(target, source)


def test_twin_rows_in_neither_layout_stay_diverged_with_what_was_tried() -> None:
    report, source, target = _graft("reversed")
    assert report.verdict is Verdict.DIVERGED
    assert not _same(target, source)
    assert len(report.tried) >= 2 and not any(t.endswith("kept") for t in report.tried)
    assert all("still diverged" in t for t in report.tried)
    assert "hypotheses tried" in str(report.divergence)
