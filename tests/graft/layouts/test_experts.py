"""Mixture-of-experts layers: per-expert tensors <-> stacked parameters, with real models.

transformers 5 holds experts as fused 3-D parameters while its ``save_pretrained`` writes the
Hub's per-expert layout; hand-written models hold either. Every graft here is checked on the
outputs, and every way of breaking a layer's experts on the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import torchgraft as tg
from torchgraft.graft.check.compare import compare
from torchgraft.graft.layouts.experts import per_expert
from torchgraft.graft.sides.source import open_source
from torchgraft.meta import TensorRef

transformers = pytest.importorskip("transformers")

TINY = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2}
#: name: (config class, model class, MoE options). Each writes its own Hub layout.
MOE = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
                   "head_dim": 8}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
                   "shared_expert_intermediate_size": 20}),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2}),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
                     "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 8,
                     "q_lora_rank": 8, "qk_rope_head_dim": 4, "qk_nope_head_dim": 4,
                     "v_head_dim": 8, "n_group": 1, "topk_group": 1}),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 8,
                 "layer_types": ["full_attention", "full_attention"]}),
}
TOKENS = torch.tensor([[1, 5, 9, 13, 2, 7]])


def build(name: str, seed: int, **changes: Any) -> Any:
    config_cls, model_cls, options = MOE[name]
    config = getattr(transformers, config_cls)(**TINY, **(options | changes))
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(config).eval()


def logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(TOKENS).logits  # type: ignore[no-any-return]


def saved(name: str, folder: Path) -> Path:
    build(name, seed=0).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("name", sorted(MOE))
def test_save_pretrained_folder_into_the_same_class(name: str, tmp_path: Path) -> None:
    folder = saved(name, tmp_path / name)
    expected = logits(transformers.AutoModelForCausalLM.from_pretrained(folder).eval())
    model = build(name, seed=1)  # other values everywhere
    report = tg.graft(folder, model)
    assert report.ok and not report.missing and not report.unused, report
    assert torch.equal(logits(model), expected)


def rewrite(folder: Path, change: Any) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


EXPERT = "model.layers.0.mlp.experts.{}.up_proj.weight"


@pytest.mark.parametrize(("change", "says"), [
    (lambda t: t.pop(EXPERT.format(2)), "experts 2 have no up weight"),
    (lambda t: t.update({EXPERT.format(3): torch.zeros(6, 16)}), "experts 3 differ"),
    (lambda t: [t.pop(k) for k in list(t) if ".layers.0.mlp.experts.3." in k],
     "the checkpoint has 3 experts, the model 4 (experts missing: 3)"),
])
def test_broken_experts_are_reported_by_layer_and_expert(change: Any, says: str,
                                                         tmp_path: Path) -> None:
    folder = saved("qwen3_moe", tmp_path)
    rewrite(folder, change)
    model = build("qwen3_moe", seed=1)
    before = model.model.layers[0].mlp.experts.gate_up_proj.detach().clone()
    report = tg.graft(folder, model)
    assert not report.ok
    why = report.reasons["model.layers.0.mlp.experts.gate_up_proj"]
    assert "Cannot stack the experts of 'model.layers.0.mlp.experts'" in why and says in why
    assert "no expert of this layer was loaded" in why
    assert torch.equal(model.model.layers[0].mlp.experts.gate_up_proj, before)  # no partial
    assert "model.layers.1.mlp.experts.gate_up_proj" not in report.missing  # other layer: ok


def test_more_experts_in_the_model_than_in_the_file(tmp_path: Path) -> None:
    folder = saved("mixtral", tmp_path)
    report = tg.graft(folder, build("mixtral", seed=1, num_local_experts=8))
    why = report.reasons["model.layers.0.mlp.experts.down_proj"]
    assert "the checkpoint has 4 experts, the model 8 (experts missing: 4, 5, 6, 7)" in why
    assert report.reasons["model.layers.0.block_sparse_moe.experts.0.w2.weight"] == why


@pytest.mark.parametrize(("name", "layout"), [("qwen3_moe", "per-expert"),
                                              ("mixtral", "mixtral")])
def test_saving_a_fused_model_in_the_hub_layout_loads_with_from_pretrained(
        name: str, layout: str, tmp_path: Path) -> None:
    model = build(name, seed=0)
    model.save_pretrained(tmp_path / "hub")
    ours = tmp_path / "ours"
    model.config.save_pretrained(ours)
    tg.save(model, ours / "model.safetensors", experts=layout)
    hub = load_file(tmp_path / "hub" / "model.safetensors")
    written = load_file(ours / "model.safetensors")
    assert set(written) == set(hub)  # the very names save_pretrained writes
    assert all(torch.equal(written[k], hub[k]) for k in hub)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(ours).eval()
    assert torch.equal(logits(loaded), logits(model))
    converted = tmp_path / "converted.safetensors"
    torch.save(model.state_dict(), tmp_path / "fused.pt")
    tg.convert(tmp_path / "fused.pt", converted, experts=layout)
    assert set(load_file(converted)) == set(hub) - {"lm_head.weight"} | (
        {"lm_head.weight"} if "lm_head.weight" in model.state_dict() else set())


class Expert(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner)
        self.up_proj = nn.Linear(hidden, inner)
        self.down_proj = nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class ListMoE(nn.Module):
    """Experts in an ``nn.ModuleList``, every expert weighted by the router."""

    def __init__(self, experts: int = 4, hidden: int = 8, inner: int = 6) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, inner) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.gate(x).softmax(-1)
        return sum(weights[..., e:e + 1] * expert(x) for e, expert in enumerate(self.experts))


class StackedExperts(nn.Module):
    def __init__(self, experts: int, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * inner, hidden))
        self.gate_up_proj_bias = nn.Parameter(torch.randn(experts, 2 * inner))
        self.down_proj = nn.Parameter(torch.randn(experts, hidden, inner))
        self.down_proj_bias = nn.Parameter(torch.randn(experts, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [E, ..., hidden]
        gate_up = torch.einsum("...h,eoh->e...o", x, self.gate_up_proj) + \
            self.gate_up_proj_bias[:, None]
        gate, up = gate_up.chunk(2, dim=-1)
        inner = nn.functional.silu(gate) * up
        return torch.einsum("e...i,ehi->e...h", inner, self.down_proj) + \
            self.down_proj_bias[:, None]


class StackedMoE(nn.Module):
    def __init__(self, experts: int = 4, hidden: int = 8, inner: int = 6) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = StackedExperts(experts, hidden, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.gate(x).softmax(-1)
        return (weights.movedim(-1, 0)[..., None] * self.experts(x)).sum(0)


X = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))  # not the suite's RNG state


def sources(model: nn.Module, tmp_path: Path) -> dict[str, Any]:
    torch.save(model.state_dict(), tmp_path / "w.pt")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              tmp_path / "w.safetensors")  # written sorted by name
    return {"module": model, "pt": tmp_path / "w.pt",
            "safetensors": tmp_path / "w.safetensors"}


@pytest.mark.parametrize("kind", ["module", "pt", "safetensors"])
@pytest.mark.parametrize(("make_src", "make_dst"), [(ListMoE, StackedMoE),
                                                    (StackedMoE, ListMoE)])
def test_modulelist_and_stacked_experts_both_ways(kind: str, make_src: Any, make_dst: Any,
                                                  tmp_path: Path) -> None:
    torch.manual_seed(0)
    src = make_src()
    torch.manual_seed(1)
    dst = make_dst()
    source = sources(src, tmp_path)[kind]
    report = tg.graft(source, dst, example_inputs=X, verify=kind == "module")
    assert report.ok and not report.missing and not report.unused, report
    with torch.no_grad():
        assert torch.allclose(dst(X), src(X), atol=1e-6)
    if kind == "module":
        assert report.max_abs_diff is not None and report.max_abs_diff < 1e-5


def test_stacking_reads_each_expert_into_its_slice(tmp_path: Path) -> None:
    torch.manual_seed(0)
    src, dst = ListMoE(), StackedMoE()
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, tmp_path / "w.sft")
    opened = open_source(tmp_path / "w.sft")
    reads: list[str] = []
    for name, ref in list(opened.refs.items()):  # count reads that do not go into the target
        opened.refs[name] = TensorRef(ref.meta, lambda n=name, r=ref: reads.append(n) or r.read(),
                                      ref.read_into, alias_key=ref.alias_key, span=ref.span,
                                      read_box=ref.read_box)
    from torchgraft.graft.layouts.experts import add_experts
    from torchgraft.graft.sides.model import module_side
    found = add_experts(opened.side, opened.refs, module_side(dst))
    out = torch.empty(4, 12, 8)
    opened.refs["experts.gate_up_proj"].read_into(out)
    assert reads == []  # every expert read straight into the target's slice
    expected = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight])
                            for e in src.experts])
    assert torch.equal(out, expected)
    assert "experts.gate_up_proj" in found.virtual
    opened.close()


def test_swapped_experts_change_outputs_and_verification_says_so(tmp_path: Path) -> None:
    torch.manual_seed(0)
    src = ListMoE()
    state = {k: v.contiguous() for k, v in src.state_dict().items()}
    for leaf in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
        state[f"experts.0.{leaf}"], state[f"experts.1.{leaf}"] = (state[f"experts.1.{leaf}"],
                                                                   state[f"experts.0.{leaf}"])
    save_file(state, tmp_path / "swapped.safetensors")
    dst = StackedMoE()
    report = tg.graft(tmp_path / "swapped.safetensors", dst)
    assert report.ok  # the names cannot tell: nothing to compare against
    result = compare(src, dst, X, X, module_map={})
    assert result.divergence is not None  # a source model tells them apart
    right = StackedMoE()
    report = tg.graft(src, right, example_inputs=X, verify=True)  # the model itself: verified
    assert report.ok and report.max_abs_diff is not None and report.max_abs_diff < 1e-5
    assert compare(src, right, X, X, module_map={}).divergence is None


def test_per_expert_names_without_a_model() -> None:
    torch.manual_seed(0)
    refs = open_source(StackedMoE()).refs
    names = per_expert(refs, "per-expert")
    assert "experts.3.up_proj.bias" in names and "experts.gate_up_proj" not in names
    state = StackedMoE().state_dict()
    assert names["experts.2.up_proj.weight"].read().shape == (6, 8)
    assert state["experts.gate_up_proj"].shape == (4, 12, 8)
    with pytest.raises(tg.TorchgraftError, match="experts='other'"):
        per_expert(refs, "other")


def test_gpt_oss_interleaved_in_out_experts_round_trip_through_the_per_expert_layout(
        tmp_path: Path) -> None:
    model = build("gpt_oss", seed=0)
    tg.save(model, tmp_path / "apart.safetensors", experts="per-expert")
    apart = load_file(tmp_path / "apart.safetensors")
    gate_up = model.model.layers[0].mlp.experts.gate_up_proj  # [E, H, 2I], gate/up interleaved
    assert torch.equal(apart["model.layers.0.mlp.experts.1.up_proj.weight"],
                       gate_up[1, :, 1::2].T)
    assert torch.equal(apart["model.layers.0.mlp.experts.1.up_proj.bias"],
                       model.model.layers[0].mlp.experts.gate_up_proj_bias[1, 1::2])
    again = build("gpt_oss", seed=1)
    report = tg.graft(tmp_path / "apart.safetensors", again)
    assert report.ok and not report.missing and not report.unused, report
    assert "gpt-oss order, interleaved, [E, in, out]" in \
        report.adapted["model.layers.0.mlp.experts.gate_up_proj"]
    assert torch.equal(logits(again), logits(model))


def test_unstacking_into_fewer_experts_is_refused_for_the_whole_layer() -> None:
    target = ListMoE(experts=3)
    before = target.experts[0].gate_proj.weight.detach().clone()
    report = tg.graft(StackedMoE(experts=4), target, verify=False)
    assert not report.ok
    why = report.reasons["experts.0.gate_proj.weight"]
    assert why.startswith("Cannot unstack 'experts.gate_up_proj' (4 experts) into the model's "
                          "3 experts of 'experts'")
    assert report.reasons["experts.gate_up_proj"] == why
    assert torch.equal(target.experts[0].gate_proj.weight, before)


class UpGateExperts(StackedExperts):
    """Stacks up before gate: names cannot tell it from the usual order, outputs can."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = torch.einsum("...h,eoh->e...o", x, self.gate_up_proj) + \
            self.gate_up_proj_bias[:, None]
        up, gate = gate_up.chunk(2, dim=-1)
        inner = nn.functional.silu(gate) * up
        return torch.einsum("e...i,ehi->e...h", inner, self.down_proj) + \
            self.down_proj_bias[:, None]


def test_a_source_model_verifies_the_stacking_and_catches_another_order(
        tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = sources(ListMoE(), tmp_path)["safetensors"]
    report = tg.graft(path, StackedMoE(), source_model=ListMoE, example_inputs=X, verify=True)
    assert report.ok, report
    other = StackedMoE()
    other.experts = UpGateExperts(4, 8, 6)
    report = tg.graft(path, other, source_model=ListMoE, example_inputs=X, verify=True)
    assert not report.ok and report.divergence is not None, report
