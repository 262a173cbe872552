"""Evidence per key and the verdict: a guess is never reported ok until outputs settle it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.graft.plan.test_plan import side
from torchgraft.graft import GraftReport, build_plan, parse_rules
from torchgraft.graft.evidence import EXIT_CODES, SIBLINGS, Evidence, Verdict
from torchgraft.graft.layouts.fusion import CONVENTION
from torchgraft.graft.sides.heads import Described


class Block(nn.Module):
    """Two same-shape norms around a linear, under names that no convention knows."""

    def __init__(self, names: tuple[str, str, str], order: tuple[int, int] = (0, 1)) -> None:
        super().__init__()
        self.names, self.order = names, order
        for name in names[:2]:
            self.add_module(name, nn.LayerNorm(4))
        self.add_module(names[2], nn.Linear(4, 4))
        with torch.no_grad():
            for name in names[:2]:
                getattr(self, name).weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = (getattr(self, self.names[k]) for k in self.order)
        return getattr(self, self.names[2])(second(first(x)).relu())


class Net(nn.Module):
    def __init__(self, prefix: str, names: tuple[str, str, str],
                 order: tuple[int, int] = (0, 1)) -> None:
        super().__init__()
        self.add_module(prefix, nn.ModuleList([Block(names, order)]))
        self.prefix = prefix

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.prefix)[0](x)  # type: ignore[no-any-return]


GUESSED = {"blocks.0.a.weight", "blocks.0.a.bias", "blocks.0.b.weight", "blocks.0.b.bias"}


def test_same_shape_siblings_without_names_are_guesses() -> None:
    src = side({"h.0.p.weight": (4,), "h.0.p.bias": (4,), "h.0.r.weight": (4,),
                "h.0.r.bias": (4,), "h.0.fc.weight": (3, 4)}, order=[])
    dst = side({"blocks.0.a.weight": (4,), "blocks.0.a.bias": (4,), "blocks.0.b.weight": (4,),
                "blocks.0.b.bias": (4,), "blocks.0.lin.weight": (3, 4)})
    plan = build_plan(src, dst)
    evidence = {s.target: s.evidence for s in plan.steps}
    assert {k for k, v in evidence.items() if v is Evidence.GUESS} == GUESSED
    assert evidence["blocks.0.lin.weight"] is Evidence.STRUCTURE
    guess = plan.guesses["blocks.0.a.weight"]
    assert guess.alternatives == ("h.0.r.weight",) and "source_model=" in guess.settle
    report = GraftReport.from_plan(plan)
    assert report.verdict is Verdict.UNVERIFIED and not report.ok and report.complete
    assert report.exit_code == 3 and report.headline().startswith("graft UNVERIFIED")
    data = json.loads(report.to_json())
    assert data["verdict"] == "unverified" and data["evidence"]["blocks.0.a.weight"] == "guess"
    assert data["guesses"]["blocks.0.b.bias"]["alternatives"] == ["h.0.p.bias"]
    assert "settle" in str(report) and "guess     blocks.0.a.weight" in report.details()


def test_roles_decide_between_same_shape_siblings_stored_in_another_order() -> None:
    """ln_2 stored before ln_1: the names' roles (norm#1, norm#2) pair them, not the order.

    From a source module they are structure; from a file of another code base the roles are
    only the two code bases' conventions: the same pairs are guesses (issue 16's policy).
    """
    src = side({"h.0.ln_2.weight": (4,), "h.0.ln_1.weight": (4,), "h.0.mlp.weight": (3, 4)},
               order=["h.0.ln_2.weight", "h.0.ln_1.weight", "h.0.mlp.weight"])
    dst = side({"layers.0.input_layernorm.weight": (4,),
                "layers.0.post_attention_layernorm.weight": (4,), "layers.0.ff.weight": (3, 4)})
    plan = build_plan(src, dst, match="structure", described=Described(source_is_module=True))
    assert {s.target: (s.source, s.evidence) for s in plan.steps} == {
        "layers.0.input_layernorm.weight": ("h.0.ln_1.weight", Evidence.STRUCTURE),
        "layers.0.post_attention_layernorm.weight": ("h.0.ln_2.weight", Evidence.STRUCTURE),
        "layers.0.ff.weight": ("h.0.mlp.weight", Evidence.STRUCTURE)}
    assert GraftReport.from_plan(plan).ok
    from_file = build_plan(src, dst, match="structure")
    assert {s.target: s.source for s in from_file.steps} == {
        s.target: s.source for s in plan.steps}
    assert set(from_file.guesses) == {"layers.0.input_layernorm.weight",
                                      "layers.0.post_attention_layernorm.weight"}
    assert "conventions" in from_file.guesses["layers.0.input_layernorm.weight"].why
    assert [a.what for a in from_file.assumptions] == [SIBLINGS]
    assert GraftReport.from_plan(from_file).verdict is Verdict.UNVERIFIED


def test_numbers_decide_siblings_sorted_in_a_file() -> None:
    """bn1/bn2 (numbers) against norm_1/norm_2: the numbers order them, sorted file or not."""
    names = {"l.0.bn1.weight": (4,), "l.0.bn2.weight": (4,), "l.0.conv1.weight": (4, 4, 3, 3),
             "l.0.conv2.weight": (4, 4, 3, 3)}
    src = side(dict(sorted(names.items())))
    assert not src.ordered
    dst = side({"s.0.c.1.weight": (4, 4, 3, 3), "s.0.n.1.weight": (4,),
                "s.0.c.2.weight": (4, 4, 3, 3), "s.0.n.2.weight": (4,)})
    plan = build_plan(src, dst, described=Described(source_is_module=True))
    assert {s.target: s.source for s in plan.steps}["s.0.n.2.weight"] == "l.0.bn2.weight"
    assert all(s.evidence is Evidence.STRUCTURE for s in plan.steps)
    from_file = build_plan(src, dst)  # numbers are a convention of two code bases: guesses
    assert {s.target: s.source for s in from_file.steps} == {
        s.target: s.source for s in plan.steps}
    assert all(s.evidence is Evidence.GUESS for s in from_file.steps)


def test_names_are_name_evidence() -> None:
    src = side({"module.fc.weight": (3, 4)})
    plan = build_plan(src, side({"fc.weight": (3, 4)}))
    assert [s.evidence for s in plan.steps] == [Evidence.NAME]
    assert GraftReport.from_plan(plan).verdict is Verdict.OK


def test_a_guess_settled_by_outputs_is_verified() -> None:
    torch.manual_seed(0)
    source = Net("h", ("p", "r", "fc")).eval()
    target = Net("blocks", ("a", "b", "lin")).eval()
    x = torch.randn(2, 4)
    unverified = tg.graft(source.state_dict(), Net("blocks", ("a", "b", "lin")))
    assert unverified.verdict is Verdict.UNVERIFIED and set(unverified.guesses) == GUESSED
    report = tg.graft(source, target, example_inputs=(x,))
    assert report.verdict is Verdict.OK and report.max_abs_diff == 0.0
    assert set(report.evidence.values()) == {Evidence.VERIFIED} and not report.guesses
    assert torch.equal(target(x), source(x))


def test_a_wrong_guess_is_never_ok() -> None:
    """The broken twin: the source applies its norms in the other order; from its state dict
    the pairing is a guess (and wrong), so the verdict says so."""
    torch.manual_seed(0)
    source = Net("h", ("p", "r", "fc"), order=(1, 0)).eval()
    target = Net("blocks", ("a", "b", "lin")).eval()
    x = torch.randn(2, 4)
    report = tg.graft(source.state_dict(), target)
    assert report.verdict is Verdict.UNVERIFIED and not report.ok
    assert not torch.allclose(target(x), source(x))


class Doubled(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def test_outputs_that_differ_are_diverged() -> None:
    torch.manual_seed(0)
    source = Doubled("h", ("p", "r", "fc")).eval()
    report = tg.graft(source, Net("blocks", ("a", "b", "lin")), example_inputs=(torch.randn(2, 4),),
                      verify=True)
    assert report.verdict is Verdict.DIVERGED and report.exit_code == 4 and not report.ok
    assert report.headline().startswith("graft DIVERGED")


def test_strict_refuses_a_guess() -> None:
    torch.manual_seed(0)
    with pytest.raises(tg.GraftError, match="is a guess"):
        tg.graft(Net("h", ("p", "r", "fc")).state_dict(), Net("blocks", ("a", "b", "lin")),
                 strict=True)


def test_exit_codes_per_verdict() -> None:
    assert {v.value: c for v, c in EXIT_CODES.items()} == {
        "ok": 0, "incomplete": 1, "unverified": 3, "diverged": 4}


def test_html_shows_evidence(tmp_path: Path) -> None:
    torch.manual_seed(0)
    report = tg.graft(Net("h", ("p", "r", "fc")).state_dict(), Net("blocks", ("a", "b", "lin")))
    page = report.to_html(tmp_path / "r.html").read_text()
    assert "graft UNVERIFIED" in page and "evidence: guess" in page


def test_a_deeper_checkpoint_is_not_ok_until_a_rule_drops_its_extra_blocks() -> None:
    spec = {f"layers.{n}.w.weight": (4, 4) for n in range(3)}
    dst = side({f"layers.{n}.w.weight": (4, 4) for n in range(2)})
    report = GraftReport.from_plan(build_plan(side(spec), dst))
    assert report.verdict is Verdict.UNVERIFIED and set(report.surplus) == {"layers.2.w.weight"}
    assert "blocks the model lacks" in report.settle()
    dropped = build_plan(side(spec), dst, rules=parse_rules([(r"^layers\.2\.", None)]))
    assert GraftReport.from_plan(dropped).ok


def test_a_norm_of_another_width_is_refused_not_adapted_nor_reinitialised() -> None:
    """GPT-2 of width 64 into width 128: another configuration, never 'rows 64->128'."""
    src = side({"h.0.ln.weight": (64,), "h.0.fc.weight": (64, 64), "ln_f.weight": (64,)})
    dst = side({"h.0.ln.weight": (128,), "h.0.fc.weight": (128, 128), "ln_f.weight": (128,)},
               kinds={"h.0.ln": "norm", "h.0.fc": "linear", "ln_f": "norm"})
    plan = build_plan(src, dst)
    assert not plan.steps and not plan.reinitialised
    assert "another configuration" in plan.missing["ln_f.weight"]
    assert "another configuration" in plan.missing["h.0.ln.weight"]
    head = build_plan(side({"fc.weight": (1000, 8)}), side({"fc.weight": (21, 8)},
                                                          kinds={"fc": "linear"}))
    assert set(head.reinitialised) == {"fc.weight"}


class QKV(nn.Module):
    """Separate q, k, v projections, head size ``head_dim``."""

    def __init__(self, dim: int, head_dim: int) -> None:
        super().__init__()
        self.attention = nn.Module()
        self.attention.head_dim = head_dim  # type: ignore[assignment]
        for name in ("q", "k", "v"):
            self.attention.add_module(name, nn.Linear(dim, dim))


class NeoXFused(nn.Module):
    """GPT-NeoX's fused projection, stored head by head: [heads, (q, k, v), head_size]."""

    def __init__(self, dim: int, head_size: int) -> None:
        super().__init__()
        self.attention = nn.Module()
        self.attention.head_size = head_size  # type: ignore[assignment]
        self.attention.query_key_value = nn.Linear(dim, 3 * dim)


def test_per_head_fused_qkv_is_split_head_by_head() -> None:
    torch.manual_seed(0)
    source = NeoXFused(8, 4)
    fused = source.attention.query_key_value.weight.detach().view(2, 3, 4, 8)
    target = QKV(8, 4)
    report = tg.graft(source, target)  # the module says its head size; the name, the layout
    assert report.verdict is Verdict.UNVERIFIED  # the name alone: a guess (no forward to run)
    assert all(g.why == CONVENTION for g in report.guesses.values())
    for k, name in enumerate("qkv"):
        assert torch.equal(getattr(target.attention, name).weight, fused[:, k].reshape(8, 8))
    from_file = tg.graft(source.state_dict(), QKV(8, 4))  # head count from the model alone
    assert from_file.verdict is Verdict.UNVERIFIED and "head count" in str(from_file)
    twin = QKV(8, 2)  # the broken twin: another head count, the same shapes
    assert not tg.graft(source.state_dict(), twin).ok
    assert not torch.equal(twin.attention.q.weight, fused[:, 0].reshape(8, 8))
