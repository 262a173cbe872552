"""Planning time on a 70B-layout model's metadata: names, rotary layout, and structure.

Builds transformers' LlamaForCausalLM and a Meta-layout Llama on the meta device (no memory),
then times ``build_plan`` from the transformers side (names sorted, as in a safetensors file)
to the Meta side: through the naming-family renames, and by structure alone (from sorted
names, and from definition order). Median of
several runs in this process (planning touches no tensor bytes, so there is no cache to warm).

    python bench/plan.py [--layers 80] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).parent.resolve()]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import transformers  # noqa: E402
from tests.models import MetaLlama  # noqa: E402

from torchgraft.graft import Side, build_plan  # noqa: E402
from torchgraft.graft.layouts.catalogue import layouts_for  # noqa: E402
from torchgraft.graft.sides.model import module_side  # noqa: E402


def main() -> None:
    """Time planning; print one line per way of matching."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=8192,
                                      intermediate_size=28672, num_hidden_layers=args.layers,
                                      num_attention_heads=64, num_key_value_heads=8)
    start = time.perf_counter()
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(config)
        meta = MetaLlama(32000, 8192, args.layers, 64, 8, 28672)
    built = time.perf_counter() - start
    source = module_side(hf)
    src = Side(dict(sorted(source.tensors.items())))  # a safetensors file's sorted names
    dst = module_side(meta)
    print(f"{len(src.tensors)} source tensors, {len(dst.tensors)} target tensors; both models "
          f"built on meta in {built:.2f} s")
    cases = (("names (sorted file)", src, "auto"), ("structure (sorted file)", src, "structure"),
             ("structure (defined order)", source, "structure"))
    for label, side, match in cases:
        times, plan = [], None
        for _ in range(args.runs):
            start = time.perf_counter()
            plan = build_plan(side, dst, layouts=layouts_for(side, dst), match=match)  # type: ignore[arg-type]
            times.append(time.perf_counter() - start)
        assert plan is not None
        print(f"{label:<26} plan {statistics.median(times):.3f} s (median of {args.runs}): "
              f"{len(plan.steps)} filled, {len(plan.missing)} missing")


if __name__ == "__main__":
    main()
