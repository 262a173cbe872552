"""Run by ``torch.distributed.run`` from test_dtensor.py: graft into sharded models, each rank.

Usage: ``python -m torch.distributed.run --nproc_per_node 4 dtensor_ranks.py FOLDER``. FOLDER
holds the files test_dtensor.py wrote; each rank writes ``rank{N}.json``: per scenario, the
report's verdict and text, the largest difference from the unsharded model's output, whether
a training step ran, or the error raised.
"""

from __future__ import annotations

import json
import os
import sys
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn

import torchgraft as tg

FOLDER = Path(sys.argv[1]) if __name__ == "__main__" else Path()


class MLP(nn.Module):
    """Sizes that do not divide evenly by 4: some shards are short, one is empty."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 12)
        self.down = nn.Linear(12, 6)
        self.head = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.down(torch.relu(self.up(x)))))


class GPT2MLP(nn.Module):
    """GPT-2's MLP written with nn.Linear (the file stores Conv1D weights, [in, out])."""

    def __init__(self) -> None:
        super().__init__()
        self.c_fc = nn.Linear(16, 64)
        self.c_proj = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(nn.functional.gelu(self.c_fc(x), approximate="tanh"))


def block() -> nn.Module:
    """GPT-2's block, as far as its MLP goes: ``mlp.c_fc``, ``mlp.c_proj``."""
    return nn.Sequential(OrderedDict(mlp=GPT2MLP()))


def fused() -> nn.Module:
    """A fused projection (timm's ``attn.qkv``); the file holds ``q``, ``k`` and ``v``."""
    return nn.Sequential(OrderedDict(attn=nn.Sequential(OrderedDict(qkv=nn.Linear(8, 24)))))


class Vocab(nn.Module):
    """An embedding grown from 10 rows (the file) to 12: the rows both have are kept."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(x))


def build(kind: Callable[[], nn.Module], meta: bool) -> nn.Module:
    torch.manual_seed(1)  # not the file's values
    if meta:
        with torch.device("meta"):
            return kind()
    return kind()


def fsdp(model: nn.Module, mesh: Any) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for child in model.children():
        fully_shard(child, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def tp(model: nn.Module, mesh: Any, plan: dict[str, str]) -> nn.Module:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    styles = {"col": ColwiseParallel, "row": RowwiseParallel,
              "col-sharded": lambda: ColwiseParallel(use_local_output=False)}
    return parallelize_module(model, mesh, {k: styles[v]() for k, v in plan.items()})


def reference(kind: Callable[[], nn.Module], state: dict[str, torch.Tensor]) -> nn.Module:
    model = kind()
    model.load_state_dict(state)
    return model


def check(model: nn.Module, ref: nn.Module, x: torch.Tensor, train: bool) -> dict[str, Any]:
    """Values (bit for bit) and output against the unsharded model's, then a training step."""
    from torch.distributed.tensor import DTensor

    expected = ref.state_dict()
    exact = [k for k, v in model.state_dict().items()
             if torch.equal(v.full_tensor() if isinstance(v, DTensor) else v, expected[k])]

    def run(x: torch.Tensor) -> torch.Tensor:
        y = model(x)
        return y.full_tensor() if isinstance(y, DTensor) else y  # column-sharded outputs

    with torch.no_grad():
        diff = (run(x) - ref(x)).abs().max().item()
    out: dict[str, Any] = {"max_diff": diff, "exact": exact == list(expected)}
    if train:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = run(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            after = run(x).pow(2).mean().item()
        out["trained"] = bool(torch.isfinite(loss).item()) and after < loss.item()
    return out


def scenarios(world: int) -> dict[str, Callable[[], dict[str, Any]]]:
    from safetensors.torch import load_file
    from torch.distributed.device_mesh import init_device_mesh

    flat = init_device_mesh("cpu", (world,))
    grid = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp")) \
        if world == 4 else None
    state = load_file(FOLDER / "model.safetensors")
    ref = reference(MLP, state)
    torch.manual_seed(5)
    x = torch.randn(3, 8)
    col_row = {"up": "col", "down": "row"}

    def graft(model: nn.Module, source: str | Path, **kw: Any) -> dict[str, Any]:
        report = tg.graft(source, model, **kw)
        return {"ok": report.ok, "verdict": str(report.verdict),
                "assumed": [a.what for a in report.assumptions], "report": str(report)}

    def fsdp_meta_pt() -> dict[str, Any]:
        model = fsdp(build(MLP, meta=True), flat)
        out = graft(model, FOLDER / "dp.pt")
        return out | check(model, ref, x, train=True)

    def fsdp_safetensors() -> dict[str, Any]:
        model = fsdp(build(MLP, meta=False), flat)
        out = graft(model, FOLDER / "model.safetensors")
        return out | check(model, ref, x, train=True)

    def tp_meta_hf_folder() -> dict[str, Any]:
        model = tp(build(MLP, meta=True), flat, col_row)
        out = graft(model, FOLDER / "hf")
        return out | check(model, ref, x, train=True)

    def fsdp_tp_grid() -> dict[str, Any]:
        assert grid is not None
        model = fsdp(tp(build(MLP, meta=True), grid["tp"], col_row), grid["dp"])
        out = graft(model, FOLDER / "model.safetensors")
        return out | check(model, ref, x, train=True)

    def gpt2_conv1d() -> dict[str, Any]:
        assert grid is not None
        model = build(block, meta=True)
        tp(model.get_submodule("mlp"), grid["tp"], {"c_fc": "col", "c_proj": "row"})
        fsdp(model, grid["dp"])
        out = graft(model, FOLDER / "gpt2_mlp.safetensors")
        io = torch.load(FOLDER / "gpt2_io.pt", weights_only=True)
        with torch.no_grad():
            out["max_diff"] = (model(io["x"]) - io["y"]).abs().max().item()
        return out

    def fused_qkv() -> dict[str, Any]:
        """q, k, v from the file into a column-sharded fused qkv: each rank reads its rows."""
        assert grid is not None
        model = build(fused, meta=True)
        tp(model.get_submodule("attn"), grid["tp"], {"qkv": "col-sharded"})
        fsdp(model, grid["dp"])
        parts = load_file(FOLDER / "qkv.safetensors")
        expected = reference(fused, {
            f"attn.qkv.{leaf}": torch.cat([parts[f"attn.{p}.{leaf}"] for p in "qkv"])
            for leaf in ("weight", "bias")})
        return graft(model, FOLDER / "qkv.safetensors") | check(model, expected, x, train=True)

    def grown_vocab() -> dict[str, Any]:
        """An adaptation that keeps the model's own rows: the whole tensor, then the block."""
        from torch.distributed.tensor import DTensor

        own = build(Vocab, meta=False).embed.weight.detach().clone()
        model = fsdp(build(Vocab, meta=False), flat)
        out = graft(model, FOLDER / "vocab.safetensors")
        weight = model.embed.weight
        assert isinstance(weight, DTensor)
        full = weight.full_tensor()
        stored = load_file(FOLDER / "vocab.safetensors")["embed.weight"]
        return out | {"kept": torch.equal(full[:10], stored) and torch.equal(full[10:],
                                                                             own[10:])}

    def dcp_2_into_4() -> dict[str, Any]:
        model = build(DCPNet, meta=True)
        fsdp(model, flat)
        out = graft(model, FOLDER / "dcp", weights_key="model")
        full = torch.load(FOLDER / "reference.pt", weights_only=True)
        return out | check(model, reference(DCPNet, full), torch.randn(2, 8), train=True)

    def dcp_converted_for_4() -> dict[str, Any]:
        """tg.convert(..., ranks=4): torch's dcp.load reads it; graft reads one file a rank."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.tensor import DTensor

        from torchgraft.io import dcp as dcp_format

        loaded = fsdp(build(MLP, meta=False), flat)
        state = loaded.state_dict()
        dcp.load(state, checkpoint_id=FOLDER / "dcp4")
        by_torch = all(torch.equal(v.full_tensor() if isinstance(v, DTensor) else v,
                                   ref.state_dict()[k]) for k, v in state.items())
        model = fsdp(build(MLP, meta=True), flat)
        with mock.patch.object(dcp_format, "read_archive",
                               wraps=dcp_format.read_archive) as opened:
            out = graft(model, FOLDER / "dcp4")
        files = {Path(call.args[0].name.partition("[")[0]).name
                 for call in opened.call_args_list}
        own = {f"__{dist.get_rank()}_0.distcp"}
        return out | check(model, ref, x, train=True) | {
            "by_torch": by_torch, "files": sorted(files),
            "own_file_only": bool(files) and files <= own}

    def broken_shape() -> dict[str, Any]:
        return graft(fsdp(build(MLP, meta=True), flat), FOLDER / "wrong_shape.safetensors")

    def broken_missing() -> dict[str, Any]:
        return graft(fsdp(build(MLP, meta=False), flat), FOLDER / "missing.safetensors")

    def verify_refused() -> dict[str, Any]:
        model = fsdp(build(MLP, meta=True), flat)
        return graft(model, FOLDER / "model.safetensors", verify=True)

    def partial_placement() -> dict[str, Any]:
        from torch.distributed.tensor import DTensor, Partial

        model = build(MLP, meta=False)
        model.head.weight = nn.Parameter(DTensor.from_local(torch.zeros(5, 6), flat,
                                                            [Partial()]))
        return graft(model, FOLDER / "model.safetensors")

    return {f.__name__: f for f in (fsdp_meta_pt, fsdp_safetensors, tp_meta_hf_folder,
                                    fsdp_tp_grid, gpt2_conv1d, fused_qkv, grown_vocab,
                                    dcp_2_into_4,
                                    dcp_converted_for_4, broken_shape, broken_missing,
                                    partial_placement, verify_refused)}


class DCPNet(nn.Sequential):
    """The model tests/dcp_writer.py saves from 2 ranks."""

    def __init__(self) -> None:
        super().__init__(nn.Linear(8, 15), nn.ReLU(), nn.Linear(15, 3))


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results: dict[str, Any] = {}
    only = os.environ.get("TG_SCENARIOS")
    for name, run in scenarios(world).items():
        if only and name not in only.split(","):
            continue
        try:
            results[name] = run()
        except tg.TorchgraftError as exc:
            results[name] = {"error": type(exc).__name__, "message": str(exc)}
        dist.barrier()
    (FOLDER / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
    dist.barrier()  # every rank done before the group goes: gloo aborts on a lone teardown
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # now and then a C++ destructor at exit called std::terminate: results are in


if __name__ == "__main__":
    main()
