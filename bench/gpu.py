"""Loading a 4 GiB checkpoint into a model on a CUDA GPU: tg.graft against the best plain ways.

Target (the performance issue, 6): ``tg.graft(path, model_on_cuda)`` at most 0.8x the wall
time of the best of ``load_state_dict(safetensors.torch.load_file(path, device="cuda"))`` and
``load_state_dict(torch.load(path, map_location="cuda"))``, with peak host RSS at most 0.25x
of the checkpoint. tg.graft reads each tensor into one of two pinned host buffers and copies
it to the device asynchronously while the next one is read. Each method runs in a fresh
process, the model built on the GPU first (not timed), the page cache warmed, median of
``--repeat`` rounds, ratios the median of per-round ratios. The physical limit is the file's
bytes read into two pinned buffers in turn and copied to the GPU, parsing nothing. Without a GPU
it says so and measures nothing.

Run on a machine with a GPU: python bench/gpu.py [--layers 1024] [--repeat 3]
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

import torch  # noqa: E402

from harness import (  # noqa: E402
    checksum,
    linears,
    median_of,
    pair_ratios,
    peak_rss,
    warm,
    worker,
    write_linears,
)

METHODS = {
    "load_file_cuda": ("linears.safetensors", "load_state_dict(load_file(path, device='cuda'))"),
    "torch_load_cuda": ("linears.pt", "load_state_dict(torch.load(path, map_location='cuda'))"),
    "graft_safetensors": ("linears.safetensors", "tg.graft(path, model_on_cuda)  (.safetensors)"),
    "graft_torch": ("linears.pt", "tg.graft(path, model_on_cuda)  (.pt)"),
    "limit": ("linears.safetensors", "limit: file -> 2 pinned buffers -> GPU, no parsing"),
}
_CHUNK = 64 << 20


def _limit(path: Path) -> None:
    """The file's bytes into one GPU tensor through two pinned buffers, reads and copies
    overlapping: what any loader of this file onto this GPU needs at least."""
    size = path.stat().st_size
    out = torch.empty(size, dtype=torch.uint8, device="cuda")
    buffers = [torch.empty(_CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    done = [torch.cuda.Event(), torch.cuda.Event()]
    offset = 0
    with path.open("rb", buffering=0) as f:
        while offset < size:
            turn = (offset // _CHUNK) % 2
            done[turn].synchronize()
            count = f.readinto(memoryview(buffers[turn].numpy()))
            out[offset:offset + count].copy_(buffers[turn][:count], non_blocking=True)
            done[turn].record()
            offset += count


def load(method: str, path: Path, layers: int) -> dict[str, float]:
    """One timed load in this fresh process; the model is built on the GPU first."""
    from safetensors.torch import load_file

    import torchgraft as tg

    model = linears(layers, "cuda")  # 4 MiB each: 1024 layers make 4 GiB
    graft = tg.graft
    torch.cuda.synchronize()
    start = time.perf_counter()
    if method == "limit":
        _limit(path)
    elif method == "load_file_cuda":
        model.load_state_dict(load_file(str(path), device="cuda"))
    elif method == "torch_load_cuda":
        model.load_state_dict(torch.load(path, map_location="cuda", weights_only=True))
    else:
        assert graft(path, model, strict=True).ok
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    total = 0.0 if method == "limit" else checksum(model)  # the limit fills no model
    return {"seconds": seconds, "checksum": total, "peak_rss": peak_rss()}


def main() -> None:
    """Write the checkpoint, run every method alternately, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "PATH"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU here; nothing measured")
        return
    if args.worker:
        method, path = args.worker
        if method == "make":

            write_linears(Path(path), args.layers)
            print("{}")
        else:
            print(json.dumps(load(method, Path(path), args.layers)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        worker(__file__, "make", tmp, "--layers", str(args.layers))
        size = (Path(tmp) / "linears.safetensors").stat().st_size
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
        for _ in range(args.repeat):
            for method, (file, _label) in METHODS.items():
                warm(Path(tmp) / file)
                runs[method].append(worker(__file__, method, str(Path(tmp) / file),
                                           "--layers", str(args.layers)))
    sums = {r["checksum"] for m, rs in runs.items() if m != "limit" for r in rs}
    assert len(sums) == 1, sums
    result = {m: median_of(rs, "seconds", "peak_rss") for m, rs in runs.items()}
    gib = 2**30
    print(f"checkpoint: {size / gib:.2f} GiB on {torch.cuda.get_device_name()}")
    for method, (_file, label) in METHODS.items():
        r = result[method]
        print(f"{label:<58} {r['seconds']:6.3f} s  host peak RSS {r['peak_rss'] / gib:5.2f} GiB")
    best = [min(a["seconds"], b["seconds"])
            for a, b in zip(runs["load_file_cuda"], runs["torch_load_cuda"], strict=True)]
    for ours in ("graft_safetensors", "graft_torch"):
        time_ratio = statistics.median(r["seconds"] / b for r, b in zip(runs[ours], best,
                                                                          strict=True))
        to_limit = pair_ratios(runs[ours], runs["limit"])
        rss_ratio = result[ours]["peak_rss"] / size
        met = time_ratio <= 0.8 and rss_ratio <= 0.25
        print(f"{ours}: time {time_ratio:.2f}x the best plain way of each round (<= 0.8), "
              f"{to_limit:.2f}x the limit, host RSS {rss_ratio:.2f}x the checkpoint (<= 0.25): "
              f"{'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
