"""Search where outputs diverge: found in the vocabulary, kept as the plan's steps and as rules.

transformers' CodeGen stores its fused ``qkv_proj`` per model-parallel core, ``[q, v, k]``
inside each of 4 cores; GPT-J keeps q, k, v apart. No table says so: with the source's code at
hand the search finds it, spreads it to every layer, and records it so that ``to_rules()``
gives a file that reproduces the graft bit for bit with no search, ok by rule, and
``tg.save(layout_of=)`` writes the model back in CodeGen's layout. The budget is counted: a
32-layer model costs about one layer's search.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.graft.pairs.values import randomise
from torchgraft.graft.evidence import Verdict

transformers = pytest.importorskip("transformers")

IDS = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))


def _codegen(layers: int = 2) -> nn.Module:
    config = transformers.CodeGenConfig(vocab_size=64, n_positions=64, n_ctx=64, n_embd=32,
                                        n_layer=layers, n_head=4, rotary_dim=4,
                                        tie_word_embeddings=False)
    return randomise(transformers.CodeGenForCausalLM(config)).eval()


def _gptj(layers: int = 2) -> nn.Module:
    config = transformers.GPTJConfig(vocab_size=64, n_positions=64, n_embd=32, n_layer=layers,
                                     n_head=4, rotary_dim=4, tie_word_embeddings=False)
    return transformers.GPTJForCausalLM(config).eval()


def _logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits  # type: ignore[no-any-return]


def test_per_core_fused_rows_are_found_and_spread() -> None:
    source, target = _codegen(), _gptj()
    report = tg.graft(source, target)  # inputs generated from the models
    assert report.verdict is Verdict.OK, report.details()
    assert torch.equal(_logits(target), _logits(source))
    assert report.settled == [
        "'transformer.h.0.attn.q_proj', 'transformer.h.0.attn.k_proj', "
        "'transformer.h.0.attn.v_proj' read from fused rows stored as 4 groups of [q; v; k] "
        "(8+8+8 rows each), found by comparing activations (and the same in 1 more units of "
        "its type)"]
    assert "found by comparing activations" in report.adapted["transformer.h.1.attn.k_proj.weight"]


def test_the_twin_whose_rows_no_layout_reads_stays_diverged() -> None:
    """Broken twin: CodeGen's fused rows reversed, which no grouping or order of parts gives."""
    source, target = _codegen(), _gptj()
    with torch.no_grad():
        for block in source.transformer.h:
            block.attn.qkv_proj.weight.copy_(block.attn.qkv_proj.weight.flip(0))
    for block in source.transformer.h:  # the source computes as before from reversed rows
        forward = block.attn.qkv_proj.forward
        block.attn.qkv_proj.forward = lambda x, f=forward: f(x).flip(-1)
    report = tg.graft(source, target)
    assert report.verdict is Verdict.DIVERGED
    assert not torch.allclose(_logits(target), _logits(source), atol=1e-4)
    assert report.tried and not report.settled


def test_what_was_found_is_written_as_rules_that_fill_by_name(tmp_path: Path) -> None:
    source, searched = _codegen(), _gptj()
    report = tg.graft(source, searched)
    rules = report.to_rules(tmp_path / "rules.json")
    assert json.loads((tmp_path / "rules.json").read_text())["rules"] == rules
    assert rules == [{"op": "deinterleave",
                      "from": r"transformer\.h\.(0|1)\.attn\.qkv_proj\.weight",
                      "to": [r"transformer.h.\1.attn.q_proj.weight",
                             r"transformer.h.\1.attn.v_proj.weight",
                             r"transformer.h.\1.attn.k_proj.weight"],
                      "sizes": [8, 8, 8]}]
    torch.save(source.state_dict(), tmp_path / "codegen.pt")
    for given in (tmp_path / "codegen.pt", source):
        again = _gptj()
        ruled = tg.graft(given, again, rules=tmp_path / "rules.json", verify=False)
        assert ruled.verdict is Verdict.OK and not ruled.tried, ruled.details()
        for key, value in searched.state_dict().items():
            assert torch.equal(again.state_dict()[key], value), key
    blind = _gptj()  # control: the same file without the rules is never ok with these values
    assert tg.graft(tmp_path / "codegen.pt", blind).verdict is not Verdict.OK
    assert not torch.equal(_logits(blind), _logits(source))


def test_what_was_found_runs_backwards(tmp_path: Path) -> None:
    """The model written back in CodeGen's layout: through the report whose search found it,
    or through the checkpoint's layout with the rules it wrote; never from the names alone."""
    source, target = _codegen(), _gptj()
    report = tg.graft(source, target)
    torch.save(source.state_dict(), tmp_path / "codegen.pt")
    report.to_rules(tmp_path / "rules.json")
    tg.save(target, tmp_path / "by_report.pt", layout_of=report)
    tg.save(target, tmp_path / "by_rules.pt", layout_of=tmp_path / "codegen.pt",
            rules=tmp_path / "rules.json")
    for written in ("by_report.pt", "by_rules.pt"):
        back = torch.load(tmp_path / written, weights_only=True)
        for key, value in source.state_dict().items():
            assert torch.equal(back[key], value), (written, key)
    with pytest.raises(tg.TorchgraftError, match="by a guess"):  # the names alone: a guess
        tg.save(target, tmp_path / "blind.pt", layout_of=tmp_path / "codegen.pt")


def _counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the forward passes a graft runs: of a unit alone, and of the whole model."""
    counts = {"unit": 0, "model": 0}
    unit = importlib.import_module("torchgraft.graft.search.unit")
    settle = importlib.import_module("torchgraft.graft.check.settle")
    compare = importlib.import_module("torchgraft.graft.check.compare")
    alone, recorded = unit.run_alone, settle.run_recorded

    def run_alone(*args: Any, **kwargs: Any) -> Any:
        counts["unit"] += 1
        return alone(*args, **kwargs)

    def run_recorded(*args: Any, **kwargs: Any) -> Any:
        counts["model"] += 1
        return recorded(*args, **kwargs)

    monkeypatch.setattr(unit, "run_alone", run_alone)
    monkeypatch.setattr(settle, "run_recorded", run_recorded)
    monkeypatch.setattr(compare, "run_recorded", run_recorded)
    return counts


@pytest.mark.slow
def test_a_deep_model_costs_about_one_layers_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget the README states: at most 2x one layer's search, plus a forward pass of
    the model per layer (counted, not timed)."""
    counts = _counted(monkeypatch)
    one = tg.graft(_codegen(1), _gptj(1))
    shallow = dict(counts)
    counts.update(unit=0, model=0)
    source, target = _codegen(32), _gptj(32)
    deep = tg.graft(source, target)
    assert one.verdict is Verdict.OK and deep.verdict is Verdict.OK, deep.details()
    assert torch.allclose(_logits(target), _logits(source), atol=1e-5)
    assert counts["unit"] <= 2 * shallow["unit"]
    assert counts["model"] <= shallow["model"] + 32
