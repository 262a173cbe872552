"""Gated MLPs: fused [gate; up] or [up; gate] <-> split gate/up, by the code base's names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.models.llama.modeling_llama import LlamaMLP
from transformers.models.phi3.modeling_phi3 import Phi3MLP

import torchgraft as tg
from torchgraft.graft.evidence import Verdict
from torchgraft.graft.layouts.fusion import CONVENTION

SIZES = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64,
         "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "pad_token_id": 0,
         "bos_token_id": 0, "eos_token_id": 0}
GATED = [f"model.layers.{n}.mlp.{p}.weight" for n in range(2) for p in ("gate_proj", "up_proj")]


def _phi3() -> nn.Module:
    """transformers' Phi-3: fused qkv_proj and gate_up_proj ([gate; up])."""
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(**SIZES)).eval()


def _llama() -> nn.Module:
    """transformers' Llama: split q/k/v and gate_proj/up_proj; the same math as Phi-3's."""
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES)).eval()


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))


@pytest.mark.slow
@pytest.mark.parametrize("way", ["phi3->llama", "llama->phi3"])
def test_fused_gate_up_and_split_gate_up_both_ways(way: str, ids: torch.Tensor) -> None:
    torch.manual_seed(0)
    source, target = (_phi3(), _llama()) if way == "phi3->llama" else (_llama(), _phi3())
    report = tg.graft(source, target, example_inputs=ids)
    assert report.verdict is Verdict.OK and report.verified_with == "the source module"
    assert not report.missing and not report.unused and not report.settled
    assert torch.allclose(_logits(source, ids), _logits(target, ids), rtol=0, atol=1e-6)
    phi3, llama = (source, target) if way == "phi3->llama" else (target, source)
    fused = phi3.model.layers[1].mlp.gate_up_proj.weight
    assert torch.equal(fused[:48], llama.model.layers[1].mlp.gate_proj.weight)
    assert torch.equal(fused[48:], llama.model.layers[1].mlp.up_proj.weight)


def test_phi3_folder_into_llama_is_verified_from_its_config(tmp_path: Path,
                                                            ids: torch.Tensor) -> None:
    torch.manual_seed(1)
    phi3, llama = _phi3(), _llama()
    phi3.save_pretrained(tmp_path / "phi3")
    report = tg.graft(tmp_path / "phi3", llama)
    assert report.verdict is Verdict.OK and report.verified_with
    assert torch.allclose(_logits(phi3, ids), _logits(llama, ids), rtol=0, atol=1e-6)


def test_phi3_bare_file_reads_its_glu_order_by_name_as_a_guess(tmp_path: Path,
                                                               ids: torch.Tensor) -> None:
    """A bare file's ``gate_up_proj`` is read ``[gate; up]`` as its name's code bases store it:
    one signal (Phi-3's names are no naming family the catalogue knows), so a guess; the
    values are right, and the source's code settles it."""
    torch.manual_seed(2)
    phi3, llama = _phi3(), _llama()
    save_file(phi3.state_dict(), tmp_path / "phi3.safetensors")
    report = tg.graft(tmp_path / "phi3.safetensors", llama)
    assert not report.missing and report.verdict is Verdict.UNVERIFIED
    assert all(report.guesses[key].why.startswith(CONVENTION[:40]) for key in GATED)
    assert report.mapping["model.layers.0.mlp.up_proj.weight"] == \
        "model.layers.0.mlp.gate_up_proj[1].weight"
    assert torch.allclose(_logits(phi3, ids), _logits(llama, ids), rtol=0, atol=1e-6)
    settled = tg.graft(tmp_path / "phi3.safetensors", _llama(), source_model=_phi3)
    assert settled.verdict is Verdict.OK, str(settled)


def _fc1_file(llama: nn.Module, *, gate_first: bool) -> dict[str, torch.Tensor]:
    """Llama's weights with each gate and up fused under ``fc1``, a name that says no order."""
    state = dict(llama.state_dict())
    for n in range(2):
        gate = state.pop(f"model.layers.{n}.mlp.gate_proj.weight")
        up = state.pop(f"model.layers.{n}.mlp.up_proj.weight")
        state[f"model.layers.{n}.mlp.fc1.weight"] = torch.cat([gate, up] if gate_first
                                                              else [up, gate])
    return state


@pytest.mark.parametrize("gate_first", [True, False], ids=["as-guessed", "halves-swapped"])
def test_a_name_that_says_no_order_is_a_guess(tmp_path: Path, gate_first: bool) -> None:
    """The broken twin: the halves swapped under ``fc1`` are never ok; neither is the right
    order, which nothing in the file tells."""
    torch.manual_seed(3)
    path = tmp_path / "fc1.safetensors"
    save_file(_fc1_file(_llama(), gate_first=gate_first), path)
    report = tg.graft(path, _llama())
    assert report.verdict is Verdict.UNVERIFIED and not report.ok
    assert set(report.guesses) == set(GATED)
    assert report.guesses[GATED[0]].alternatives == ("model.layers.0.mlp.fc1[1].weight",)
    assert "does not say which half is the gate" in report.guesses[GATED[0]].why


def test_an_ungated_fc1_is_not_split() -> None:
    """A plain MLP's ``fc1`` has no halves: it fills no gate or up projection."""
    config = transformers.LlamaConfig(hidden_size=8, intermediate_size=12, num_attention_heads=2)
    state = {"fc1.weight": torch.randn(12, 8), "down_proj.weight": torch.randn(8, 12)}
    report = tg.graft(state, LlamaMLP(config))
    assert report.verdict is Verdict.INCOMPLETE
    assert "gate_proj.weight" in report.missing  # fc1 is an up projection, as a whole
    assert not any("[" in source for source in report.mapping.values())


class OlmoStyleMLP(nn.Module):
    """AI2 OLMo's feed-forward as its code writes it: ``x, gate = ff_proj(x).chunk(2)``."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.ff_proj = nn.Linear(hidden, 2 * inner, bias=False)
        self.ff_out = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, gate = self.ff_proj(x).chunk(2, dim=-1)
        return self.ff_out(nn.functional.silu(gate) * x)


@pytest.mark.parametrize("way", ["llama->olmo", "olmo->llama"])
def test_up_first_halves_of_olmo_style_ff_proj(way: str) -> None:
    """``ff_proj`` is read ``[up; gate]``, as AI2's OLMo stores it: by its name from a bare
    state dict (a guess, with the right values), verified from the module."""
    torch.manual_seed(4)
    llama = LlamaMLP(transformers.LlamaConfig(hidden_size=8, intermediate_size=12,
                                              num_attention_heads=2)).eval()
    olmo = OlmoStyleMLP(8, 12).eval()
    source, target = (llama, olmo) if way == "llama->olmo" else (olmo, llama)
    report = tg.graft(source.state_dict(), target)
    assert report.verdict is Verdict.UNVERIFIED and report.guesses
    assert torch.equal(olmo.ff_proj.weight, torch.cat([llama.up_proj.weight,
                                                       llama.gate_proj.weight]))
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.allclose(llama(x), olmo(x), rtol=0, atol=1e-6)
    assert tg.graft(source, target).verdict is Verdict.OK  # the module: outputs compared


class FusedGLU(nn.Module):
    """A hand-written gated MLP fusing gate and up under ``fc1``, halves in either order."""

    def __init__(self, *, up_first: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 24, bias=False)
        self.down_proj = nn.Linear(12, 8, bias=False)
        self.up_first = up_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = self.fc1(x).chunk(2, dim=-1)
        gate, up = (second, first) if self.up_first else (first, second)
        return self.down_proj(nn.functional.silu(gate) * up)


def _llama_mlp() -> nn.Module:
    config = transformers.LlamaConfig(hidden_size=8, intermediate_size=12, num_attention_heads=2)
    return LlamaMLP(config).eval()


@pytest.mark.parametrize("up_first", [False, True], ids=["gate-first", "up-first"])
@pytest.mark.parametrize("way", ["fused->split", "split->fused"])
def test_a_guessed_glu_order_is_settled_by_outputs(way: str, up_first: bool) -> None:
    """From a state dict the order under ``fc1`` is a guess either way; compared outputs settle
    it (the gate and up swapped, or the fused halves exchanged) and the graft is right."""
    torch.manual_seed(5)
    fused, split = FusedGLU(up_first=up_first).eval(), _llama_mlp()
    source, target = (fused, split) if way == "fused->split" else (split, fused)
    guessed = tg.graft(source.state_dict(), target)
    assert guessed.verdict is Verdict.UNVERIFIED and guessed.guesses
    x = torch.randn(3, 8)
    report = tg.graft(source, target, example_inputs=x)
    assert report.verdict is Verdict.OK
    assert bool(report.settled) == up_first
    with torch.no_grad():
        assert torch.allclose(fused(x), split(x), rtol=0, atol=1e-6)


def _phi3_mlp() -> nn.Module:
    config = transformers.Phi3Config(hidden_size=8, intermediate_size=12, num_attention_heads=2)
    return Phi3MLP(config).eval()


@pytest.mark.parametrize("way", ["phi3->olmo", "olmo->phi3"])
def test_fused_into_fused_of_the_other_order_exchanges_the_halves(way: str) -> None:
    """Phi-3's ``gate_up_proj`` [gate; up] and OLMo's ``ff_proj`` [up; gate]: the same shape,
    which structure alone would copy as stored."""
    torch.manual_seed(6)
    phi3, olmo = _phi3_mlp(), OlmoStyleMLP(8, 12).eval()
    source, target = (phi3, olmo) if way == "phi3->olmo" else (olmo, phi3)
    report = tg.graft(source.state_dict(), target)
    assert report.verdict is Verdict.OK and not report.guesses
    fused = "ff_proj.weight" if way == "phi3->olmo" else "gate_up_proj.weight"
    assert report.adapted[fused].startswith("halves exchanged")
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.allclose(phi3(x), olmo(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("up_first", [False, True], ids=["gate-first", "up-first"])
def test_fused_into_a_fused_name_that_says_no_order_is_a_guess(up_first: bool) -> None:
    torch.manual_seed(7)
    phi3, fused = _phi3_mlp(), FusedGLU(up_first=up_first).eval()
    guessed = tg.graft(phi3.state_dict(), fused)
    assert guessed.verdict is Verdict.UNVERIFIED and set(guessed.guesses) == {"fc1.weight"}
    x = torch.randn(3, 8)
    report = tg.graft(phi3, fused, example_inputs=x)
    assert report.verdict is Verdict.OK and bool(report.settled) == up_first
    with torch.no_grad():
        assert torch.allclose(phi3(x), fused(x), rtol=0, atol=1e-6)


def test_llama_written_back_in_phi3s_fused_layout(tmp_path: Path) -> None:
    """``tg.save(layout_of=report)`` fuses gate and up back into Phi-3's ``gate_up_proj``."""
    torch.manual_seed(8)
    phi3, llama = _phi3(), _llama()
    phi3.save_pretrained(tmp_path / "phi3")
    report = tg.graft(tmp_path / "phi3", llama)
    assert report.ok
    tg.save(llama, tmp_path / "back.safetensors", layout_of=report)
    back, stored = (load_file(path) for path in (tmp_path / "back.safetensors",
                                                 tmp_path / "phi3" / "model.safetensors"))
    assert set(back) == set(stored)
    assert all(torch.equal(back[key], stored[key]) for key in stored)


def test_olmo_style_written_back_in_phi3s_order(tmp_path: Path) -> None:
    """The halves exchanged on the way in are exchanged back on the way out."""
    torch.manual_seed(9)
    phi3 = _phi3_mlp()
    save_file(phi3.state_dict(), tmp_path / "phi3.safetensors")
    olmo = OlmoStyleMLP(8, 12).eval()
    assert tg.graft(tmp_path / "phi3.safetensors", olmo).ok
    tg.save(olmo, tmp_path / "back.safetensors", layout_of=tmp_path / "phi3.safetensors")
    back = load_file(tmp_path / "back.safetensors")
    assert torch.equal(back["gate_up_proj.weight"], phi3.gate_up_proj.weight)
