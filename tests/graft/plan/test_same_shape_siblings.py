"""Same-shape tensors and modules that only order or names tell apart: one signal is a guess.

ConvNeXt V2 from its original code base (GRN ``gamma``, ``beta``; the stem and the downsampling
layers in one list of their own) into transformers' ``ConvNextV2`` (GRN ``weight``, ``bias``;
each stage's downsampling inside the stage). Two classes of false ok lived here:

- a file stored sorted (``beta`` before ``gamma``) paired a module's same-shape tensors in
  stored order, and the module's pairing, known by structure, vouched for them;
- a block's norm and a downsampling norm of the same width, each the only one in its unit, were
  exchanged across blocks, and the pair whose block went elsewhere was dropped as a guess with
  no alternative.

Each file case must end ok only with the source's outputs; with the source's code at hand
(``source_model=``) it ends ok with them, both ways. transformers' ``.pt`` keeps its order of
definition (each stage's downsampling first), which the original model's order of use agrees
with: two real orders that place every norm, ok with the source's outputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import torchgraft as tg
from tests.graft.plan.test_plan import side
from tests.models import GRN, ConvNeXtV2
from torchgraft.graft import build_plan
from torchgraft.graft.evidence import Evidence, Verdict

transformers = pytest.importorskip("transformers")

X = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _hf() -> nn.Module:
    config = transformers.ConvNextV2Config(depths=[1, 1], hidden_sizes=[16, 32], num_stages=2,
                                           num_labels=10, drop_path_rate=0.0)
    return transformers.ConvNextV2ForImageClassification(config).eval()


def _drawn(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.normal_(0, 0.3)
    return model.eval()


def _out(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out = model(X)
    return getattr(out, "logits", out)


def _equal(a: nn.Module, b: nn.Module) -> bool:
    expected, actual = _out(a), _out(b)
    return bool((expected - actual).abs().max() <= 1e-4 * expected.abs().max())


def _write(model: nn.Module, folder: Path, flavour: str) -> Path:
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if flavour == "pt":
        torch.save(state, folder / "model.pt")
        return folder / "model.pt"
    save_file(state, str(folder / "model.safetensors"))  # stored sorted by name
    return folder / "model.safetensors"


WAYS = {"original -> transformers": (ConvNeXtV2, _hf),
        "transformers -> original": (_hf, ConvNeXtV2)}


@pytest.mark.parametrize("flavour", ["pt", "safetensors"])
@pytest.mark.parametrize("way", list(WAYS))
def test_a_file_alone_is_never_ok_with_other_outputs(tmp_path: Path, way: str,
                                                     flavour: str) -> None:
    make_source, make_target = WAYS[way]
    source, target = _drawn(make_source()), make_target()
    report = tg.graft(_write(source, tmp_path, flavour), target)
    assert not report.missing
    equal = _equal(source, target)
    assert report.verdict is not Verdict.OK or equal, report.details()
    if flavour == "safetensors" or way == "original -> transformers":
        assert report.verdict is Verdict.UNVERIFIED, report  # the exchange is a guess
    else:  # transformers' order of definition, the original's order of use: both real, alike
        assert report.verdict is Verdict.OK and equal, report


@pytest.mark.parametrize("flavour", ["pt", "safetensors"])
@pytest.mark.parametrize("way", list(WAYS))
def test_the_source_code_settles_it(tmp_path: Path, way: str, flavour: str) -> None:
    make_source, make_target = WAYS[way]
    source, target = _drawn(make_source()), make_target()
    report = tg.graft(_write(source, tmp_path, flavour), target, source_model=make_source)
    assert report.verdict is Verdict.OK, report.details()
    assert _equal(source, target)


def test_a_live_module_is_right_and_ok() -> None:
    source, target = _drawn(ConvNeXtV2()), _hf()
    report = tg.graft(source, target, example_inputs=X)
    assert report.verdict is Verdict.OK and _equal(source, target), report.details()


# The rule, on metadata alone ----------------------------------------------------------------

def _grn_plan(leaves: tuple[str, str], *, sort: bool) -> dict[str, tuple[str, Evidence]]:
    """A GRN-like module (two same-shape tensors) under other leaf names than the model's."""
    names = [f"blocks.0.grn.{leaf}" for leaf in leaves]
    src = side(dict.fromkeys(sorted(names) if sort else names, (1, 1, 1, 8)))
    dst = side({f"layers.0.response.{leaf}": (1, 1, 1, 8) for leaf in ("weight", "bias")})
    plan = build_plan(src, dst)
    evidence = {s.target: plan.guesses.get(s.target) for s in plan.steps}
    return {s.target: (s.source, Evidence.GUESS if evidence[s.target] else Evidence.STRUCTURE)
            for s in plan.steps}


def test_roles_and_a_real_order_agreeing_are_evidence() -> None:
    assert _grn_plan(("gamma", "beta"), sort=False) == {
        "layers.0.response.weight": ("blocks.0.grn.gamma", Evidence.STRUCTURE),
        "layers.0.response.bias": ("blocks.0.grn.beta", Evidence.STRUCTURE)}


def test_roles_alone_pair_a_sorted_file_but_only_as_a_guess() -> None:
    """Sorted, ``beta`` comes first: the roles of the names pair it with ``bias``, one signal."""
    assert _grn_plan(("gamma", "beta"), sort=True) == {
        "layers.0.response.weight": ("blocks.0.grn.gamma", Evidence.GUESS),
        "layers.0.response.bias": ("blocks.0.grn.beta", Evidence.GUESS)}


@pytest.mark.parametrize("sort", [False, True])
def test_names_without_roles_leave_order_alone_a_guess(sort: bool) -> None:
    """Twin: leaves no convention knows (``a``, ``c``): a real order is one signal at most."""
    pairs = _grn_plan(("c", "a"), sort=sort)
    assert {evidence for _, evidence in pairs.values()} == {Evidence.GUESS}


def test_the_original_grn_keeps_its_names() -> None:
    assert [name for name, _ in GRN(4).named_parameters()] == ["gamma", "beta"]
