"""Fused projections under names no table lists: rows that add up, in aligned scopes.

A model whose attention fuses ``[q; k; v]`` (grouped-query, unequal parts) as ``mixer_in`` and
whose MLP fuses ``[gate; up]`` as ``w_in``, against one that keeps them apart under
transformers' names, both ways: from a module with inputs, ok with equal outputs; from a bare
file, filled with equal outputs and honestly unverified (the fused layout and the halves'
order are what no name states). A fused projection stored head by head (another layout, the
same shape) is never ok.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchgraft as tg
from tests.graft.pairs.values import drawn
from torchgraft.graft.layouts import fusion, glu
from torchgraft.graft.plan.infer import HEAD_BY_HEAD

C, HEADS, KV, INNER, VOCAB = 32, 4, 2, 48, 50
HD = C // HEADS
TOKENS = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    b, t, _ = q.shape
    q = q.view(b, t, HEADS, HD).transpose(1, 2)
    k, v = (x.view(b, t, KV, HD).transpose(1, 2).repeat_interleave(HEADS // KV, 1)
            for x in (k, v))
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, C)


class SplitBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(C), nn.LayerNorm(C)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(C, C)
        self.self_attn.k_proj = nn.Linear(C, KV * HD)
        self.self_attn.v_proj = nn.Linear(C, KV * HD)
        self.self_attn.o_proj = nn.Linear(C, C)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(C, INNER, bias=False)
        self.mlp.up_proj = nn.Linear(C, INNER, bias=False)
        self.mlp.down_proj = nn.Linear(INNER, C, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, h = self.self_attn, self.input_layernorm(x)
        x = x + a.o_proj(_attend(a.q_proj(h), a.k_proj(h), a.v_proj(h)))
        m, h = self.mlp, self.post_attention_layernorm(x)
        return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))  # type: ignore[no-any-return]


class FusedBlock(nn.Module):
    def __init__(self, head_by_head: bool = False) -> None:
        super().__init__()
        self.ln_a, self.ln_b = nn.LayerNorm(C), nn.LayerNorm(C)
        self.mix = nn.Module()
        self.mix.mixer_in = nn.Linear(C, C + 2 * KV * HD)
        self.mix.mixer_out = nn.Linear(C, C)
        self.ff = nn.Module()
        self.ff.w_in = nn.Linear(C, 2 * INNER, bias=False)
        self.ff.w_out = nn.Linear(INNER, C, bias=False)
        self.head_by_head = head_by_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.mix.mixer_in(self.ln_a(x))
        if self.head_by_head:  # each kv group's q heads, then its k and v (lit-gpt's layout)
            groups = fused.view(*fused.shape[:2], KV, HEADS // KV + 2, HD)
            q, k, v = groups.split([HEADS // KV, 1, 1], dim=3)
            q, k, v = (t.reshape(*fused.shape[:2], -1) for t in (q, k, v))
        else:
            q, k, v = fused.split([C, KV * HD, KV * HD], -1)
        x = x + self.mix.mixer_out(_attend(q, k, v))
        gate, up = self.ff.w_in(self.ln_b(x)).chunk(2, -1)
        return x + self.ff.w_out(F.silu(gate) * up)  # type: ignore[no-any-return]


class Net(nn.Module):
    def __init__(self, fused: bool, head_by_head: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, C)
        self.blocks = nn.ModuleList([FusedBlock(head_by_head) if fused else SplitBlock()
                                     for _ in range(2)])
        self.norm, self.head = nn.LayerNorm(C), nn.Linear(C, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # type: ignore[no-any-return]


def test_the_names_are_in_no_table() -> None:
    fused_names = {name for f in fusion.FUSIONS for name in f.fused}
    fused_names |= {name for order in glu.GLU_ORDERS for name in order.names}
    assert not {"mixer_in", "w_in", "mix", "ff"} & fused_names


@pytest.mark.parametrize("fused_source", [False, True], ids=["fuse", "split"])
@pytest.mark.parametrize("flavour", ["module", "pt"])
def test_rows_that_add_up_are_fused_or_split(fused_source: bool, flavour: str,
                                             tmp_path: Path) -> None:
    source, target = drawn(Net(fused_source)), Net(not fused_source).eval()
    if flavour == "module":
        report = tg.graft(source, target, example_inputs=(TOKENS,))
        assert report.ok, report
    else:
        torch.save(source.state_dict(), tmp_path / "s.pt")
        report = tg.graft(tmp_path / "s.pt", target)
        assert report.verdict == "unverified" and report.complete, report
        assert any(HEAD_BY_HEAD in g.alternatives for g in report.guesses.values())
    with torch.no_grad():
        assert torch.allclose(target(TOKENS), source(TOKENS), atol=1e-5)


def test_written_back_in_the_checkpoints_own_layout(tmp_path: Path) -> None:
    source = drawn(Net(fused=False))
    torch.save(source.state_dict(), tmp_path / "split.pt")
    target = Net(fused=True).eval()
    tg.graft(source, target, example_inputs=(TOKENS,))
    tg.save(target, tmp_path / "back.safetensors", layout_of=tmp_path / "split.pt",
            allow_incomplete=True)  # the bare file's order of halves is a guess
    again = Net(fused=False).eval()
    again.load_state_dict(tg.load(tmp_path / "back.safetensors"))
    with torch.no_grad():
        assert torch.allclose(again(TOKENS), source(TOKENS), atol=1e-5)


@pytest.mark.parametrize("flavour", ["module", "pt"])
def test_a_fused_projection_stored_head_by_head_is_never_a_false_ok(flavour: str,
                                                                   tmp_path: Path) -> None:
    """The twin: the model's fused projection is stored head by head; the same shapes. A
    bare file cannot tell (never ok); compared outputs either find that layout or diverge."""
    source, target = drawn(Net(fused=False)), Net(fused=True, head_by_head=True).eval()
    if flavour == "module":
        report = tg.graft(source, target, example_inputs=(TOKENS,))
    else:
        torch.save(source.state_dict(), tmp_path / "s.pt")
        report = tg.graft(tmp_path / "s.pt", target)
        assert not report.ok, report
    with torch.no_grad():
        equal = torch.allclose(target(TOKENS), source(TOKENS), atol=1e-5)
    assert equal or not report.ok, report
