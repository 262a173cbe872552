"""Many small tensors into a meta model: cost per tensor against ``load_file``, per step.

Targets (issue: linear cost): grafting a checkpoint of small tensors with mixture-of-experts
names into a model built on the meta device costs at most 3x safetensors' ``load_file`` of the
same file, at 3k and at 25k tensors; on a 100k-tensor DeepSeek-V3-shaped layout (names and
shapes only, tiny dimensions), planning takes at most 2 s, the whole graft at most 3x
``load_file``, and the plan at most 1 KiB of memory per tensor.

Each side runs in a fresh process with the file in the page cache, sides alternating; the
figure is the median of the per-pair ratios. The model is built before the clock starts. The
graft's own steps are timed by wrapping them (open, describe the model, plan, materialise,
execute, report).

Two more sides give the scale: the expert way into a meta model (``load_file``, then
``load_state_dict(assign=True)``), and the floor of any loader that puts each tensor in its
module from Python (header parsed, file mapped, a tensor per key put in its module: no check,
no plan, no report). ``load_file`` runs in a process holding nothing else, as when the targets
were set; with the model built first its own time grows by 14% (Python's collector walks
the model's objects, which the graft pauses).

Issue 34 asks for at most 1.5x on the 100k layout: not met. On the 2-core development
machine, 2026-11-28 12:04 UTC, three rounds: graft 3.32 s, ``load_file`` 1.71 s (1.94x), the
expert way 5.47 s (the graft 0.61x of it), the floor 0.73 s (0.42x ``load_file``; the graft
4.6x it). Earlier runs that day: 2.05x and 2.25x (the ratio moves with ``load_file``'s own
time). Against the commit before that day's work (3f88e93), six pairs of fresh processes:
4.28 s then, 3.46 s after (0.81x): each lazy file tensor is one object (its readers methods,
not closures) and a checkpoint's naming wrapper another, tensors are mapped from a per-dtype
empty tensor (``new()`` costs half of ``torch.empty``), and the passes skip their walks once
every target is paired. A py-spy profile (500 Hz) shows no single step to cut: opening the
file 20% (the header's JSON 5%, its checks 4%), materialising 21% (reading 8%: making a tensor
over the mapped bytes; ``nn.Parameter`` 4%; putting it in its module 2%), planning 27%
(passes over every key; deciding each plain copy 8%), one walk of the model 9%, describing it
8%, confirming every write 4%, the report 2%. What the graft adds to the floor is its checks
of the file, the plan, the read-back and the report, each some microseconds per key.

Run: python bench/tensor_count.py [--repeat 3] [--sizes 3k 25k 100k]
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/inspect.py would shadow the standard library's inspect (imported by torch): bench/
# goes last on the path, after the standard library.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(_HERE)] + [_HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from harness import pair_ratios, timed_steps, warm, warm_graft, worker  # noqa: E402

#: Layout name: (layers, experts per layer, expert biases, DeepSeek attention and shared expert).
LAYOUTS = {
    "3k": (1, 1024, False, False),
    "25k": (8, 1024, False, False),
    "100k": (65, 256, True, True),  # DeepSeek-V3 has 61 layers; 65 make 100k tensors
}
HIDDEN, INNER = 8, 4
#: The sides (the module's docstring says what each is): ``load_file``, the expert way into a
#: meta model, the floor (:func:`floor`) and the graft.
METHODS = ("load_file", "assign", "floor", "graft")


def build(layout: str, device: str = "meta") -> Any:
    """The model: DeepSeek-V3 names (``model.layers.N.mlp.experts.E.gate_proj``...)."""
    import torch
    from torch import nn

    layers, experts, bias, attention = LAYOUTS[layout]

    def linear(i: int, o: int) -> nn.Linear:
        return nn.Linear(i, o, bias=bias)

    def expert() -> nn.Module:
        m = nn.Module()
        m.gate_proj, m.up_proj, m.down_proj = (linear(HIDDEN, INNER), linear(HIDDEN, INNER),
                                               linear(INNER, HIDDEN))
        return m

    def layer() -> nn.Module:
        block = nn.Module()
        block.mlp = nn.Module()
        block.mlp.experts = nn.ModuleList(expert() for _ in range(experts))
        if attention:
            block.mlp.gate = nn.Linear(HIDDEN, experts, bias=False)
            block.mlp.gate.register_buffer("e_score_correction_bias", torch.zeros(experts))
            block.mlp.shared_experts = expert()
            attn = block.self_attn = nn.Module()
            for name, (i, o) in {"q_a_proj": (HIDDEN, 4), "q_b_proj": (4, HIDDEN),
                                 "kv_a_proj_with_mqa": (HIDDEN, 6), "kv_b_proj": (4, 16),
                                 "o_proj": (HIDDEN, HIDDEN)}.items():
                setattr(attn, name, nn.Linear(i, o, bias=False))
            attn.q_a_layernorm, attn.kv_a_layernorm = nn.RMSNorm(4), nn.RMSNorm(4)
            block.input_layernorm = nn.RMSNorm(HIDDEN)
            block.post_attention_layernorm = nn.RMSNorm(HIDDEN)
        return block

    with torch.device(device):
        model = nn.Module()
        model.model = nn.Module()
        model.model.layers = nn.ModuleList(layer() for _ in range(layers))
        if attention:
            model.model.embed_tokens = nn.Embedding(64, HIDDEN)
            model.model.norm = nn.RMSNorm(HIDDEN)
            model.lm_head = nn.Linear(HIDDEN, 64, bias=False)
    return model


def make(folder: Path) -> None:
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    for layout in LAYOUTS:
        state = build(layout, "cpu").state_dict()
        save_file({k: v.contiguous() for k, v in state.items()}, folder / f"{layout}.safetensors")


def plan_only(path: Path, layout: str) -> dict[str, float]:
    """Planning alone on metadata, and the plan's memory per tensor (tracemalloc)."""
    import gc
    import tracemalloc

    from torchgraft.graft.layouts.catalogue import layouts_for
    from torchgraft.graft.plan.build import build_plan
    from torchgraft.graft.sides.model import module_side
    from torchgraft.graft.sides.source import open_source

    model = build(layout)
    dst = module_side(model)
    opened = open_source(path)
    src = opened.side
    gc.disable()
    start = time.perf_counter()
    build_plan(src, dst, layouts=layouts_for(src, dst))
    seconds = time.perf_counter() - start
    tracemalloc.start()
    plan = build_plan(src, dst, layouts=layouts_for(src, dst))
    held, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    count = len(plan.steps)
    opened.close()
    return {"seconds": seconds, "bytes_per_tensor": held / count, "tensors": count}


def floor(path: Path, model: Any) -> int:
    """The floor of any loader that puts each tensor in its module from Python.

    The collector paused (as the graft pauses it), the header parsed, the file mapped once,
    then per key a tensor over its bytes made and put in its module as a parameter or buffer:
    no check of any length, offset, dtype or shape, no plan, no report. Returns the number of
    tensors.
    """
    import struct

    import torch
    from torch import nn

    with path.open("rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    end = max(entry["data_offsets"][1] for entry in header.values())
    storage = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=8 + size + end)
    empty = {"F32": torch.empty(0), "BF16": torch.empty(0, dtype=torch.bfloat16)}
    modules = dict(model.named_modules())
    for key, entry in header.items():
        first, last = entry["data_offsets"]
        tensor = empty[entry["dtype"]].new().set_(
            storage[8 + size + first:8 + size + last], 0, entry["shape"], ())
        owner, _, name = key.rpartition(".")
        module = modules[owner]
        if name in module._parameters:
            module._parameters[name] = nn.Parameter(tensor, requires_grad=False)
        else:
            module._buffers[name] = tensor
    return len(header)


def run(method: str, path: Path, layout: str) -> dict[str, Any]:
    if method in ("load_file", "assign"):
        from safetensors.torch import load_file

        model = build(layout) if method == "assign" else None  # load_file: a bare process
        start = time.perf_counter()
        tensors = load_file(path)
        if model is not None:  # the expert way into a meta model
            model.load_state_dict(tensors, strict=True, assign=True)
        return {"seconds": time.perf_counter() - start, "tensors": len(tensors)}
    if method == "floor":
        import gc

        model = build(layout)
        gc.disable()  # as the graft does
        start = time.perf_counter()
        count = floor(path, model)
        return {"seconds": time.perf_counter() - start, "tensors": count}
    if method == "plan":
        return plan_only(path, layout)
    import torchgraft as tg

    warm_graft(path.parent)
    spent = timed_steps()
    model = build(layout)
    start = time.perf_counter()
    report = tg.graft(path, model, strict=True)
    seconds = time.perf_counter() - start
    assert report.ok
    return {"seconds": seconds, "steps": spent, "tensors": len(report.loaded)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "PATH", "LAYOUT"))
    args = parser.parse_args()
    if args.worker:
        method, path, layout = args.worker
        if method == "make":
            make(Path(path))
            print("{}")
        else:
            print(json.dumps(run(method, Path(path), layout)))
        return
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=_HERE) as tmp:
        worker(__file__, "make", tmp, "-")
        for layout in args.sizes:
            path = Path(tmp) / f"{layout}.safetensors"
            runs: dict[str, list[dict[str, Any]]] = {method: [] for method in METHODS}
            for _ in range(args.repeat):
                for method in runs:
                    warm(path)
                    runs[method].append(worker(__file__, method, str(path), layout))
            plan = worker(__file__, "plan", str(path), layout)
            results[layout] = {"runs": runs, "plan": plan, "ratios": {
                method: pair_ratios(runs[method], runs["load_file"])
                for method in METHODS if method != "load_file"}}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for layout, r in results.items():
        seconds = {method: statistics.median(run["seconds"] for run in runs)
                   for method, runs in r["runs"].items()}
        graft = sorted(r["runs"]["graft"], key=lambda run: run["seconds"])
        steps = graft[len(graft) // 2]["steps"]  # the median run's
        print(f"{layout}: {r['plan']['tensors']} tensors; "
              + ", ".join(f"{method} {s:.3f} s" for method, s in seconds.items()))
        print("  median ratios to load_file: "
              + ", ".join(f"{method} {x:.2f}" for method, x in r["ratios"].items())
              + " (graft <= 3; issue 34: <= 1.5 at 100k)")
        print("  graft's steps: " + ", ".join(f"{k} {v:.3f}" for k, v in steps.items()))
        print(f"  planning alone {r['plan']['seconds']:.3f} s (<= 2), plan memory "
              f"{r['plan']['bytes_per_tensor']:.0f} B per tensor (<= 1024)")


if __name__ == "__main__":
    main()
