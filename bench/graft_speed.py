"""Grafting into a built model vs the best specialist loader for the same file, side by side.

Target: ``tg.graft`` at most 0.8x the wall time of
``safetensors.torch.load_model`` (for a ``.safetensors`` file) and of
``model.load_state_dict(torch.load(path, mmap=True, weights_only=True))`` (for a ``.pt``
file), with peak RSS at most 0.6x of theirs. The checkpoint holds 256 ``nn.Linear(1024,
1024)`` weights (1 GiB). Each method: fresh process, the model built first (not timed), page
cache warmed before each run, methods alternating; the time ratio is the median of the
per-pair ratios (each pair saw the same load on the machine).

The physical floor runs in the same alternation: the file read by ``preadv`` into memory
already touched, in as many threads as torchgraft reads with, and nothing else. On a machine
of few cores and little memory bandwidth the floor itself may be above 0.8x the specialists:
the target is then out of reach of any copy, and the row says how far from the floor the
graft is.

Run: python bench/graft_speed.py [--layers 256] [--repeat 3]
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
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from harness import (  # noqa: E402
    checksum,
    linears,
    median_of,
    pair_ratios,
    peak_rss,
    timed_steps,
    warm,
    worker,
    write_linears,
)

# Method: (file, label).
METHODS = {
    "load_model": ("linears.safetensors", "safetensors.torch.load_model(model, path)"),
    "graft_safetensors": ("linears.safetensors", "tg.graft(path, model)  (.safetensors)"),
    "torch_mmap": ("linears.pt", "load_state_dict(torch.load(path, mmap=True))"),
    "graft_torch": ("linears.pt", "tg.graft(path, model)  (.pt)"),
    "floor": ("linears.safetensors", "floor: preadv of the file into touched memory"),
}


def floor_read(path: Path) -> float:
    """The physical limit of any copy, in seconds.

    The whole file read by ``preadv`` into memory already touched (as a built model's is), in
    as many threads as torchgraft reads with, 64 MiB per call. No planning, no tensors: what
    is left when a loader does nothing else.
    """
    import os
    from concurrent.futures import ThreadPoolExecutor

    from torchgraft.io.reads import READERS

    size = path.stat().st_size
    buffer = torch.ones(size, dtype=torch.uint8)  # touched before the clock starts
    view = buffer.numpy().data
    step = 64 << 20
    fd = os.open(path, os.O_RDONLY)

    def part(k: int) -> None:
        offset, end = size * k // READERS, size * (k + 1) // READERS
        while offset < end:
            offset += os.preadv(fd, [view[offset:min(end, offset + step)]], offset)

    start = time.perf_counter()
    with ThreadPoolExecutor(READERS) as pool:
        list(pool.map(part, range(READERS)))
    seconds = time.perf_counter() - start
    os.close(fd)
    return seconds


def load(method: str, path: Path, layers: int) -> dict[str, float]:
    from safetensors.torch import load_model

    import torchgraft as tg

    if method == "floor":
        return {"seconds": floor_read(path), "checksum": None, "peak_rss": peak_rss(),
                "steps": {}}
    model = linears(layers)
    graft = tg.graft  # imported before the clock starts, as torch and safetensors are
    steps = timed_steps() if method.startswith("graft") else {}
    start = time.perf_counter()
    if method == "load_model":
        load_model(model, str(path))
    elif method == "torch_mmap":
        model.load_state_dict(torch.load(path, mmap=True, weights_only=True))
    else:
        assert graft(path, model, strict=True).ok
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "checksum": checksum(model), "peak_rss": peak_rss(),
            "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "PATH"))
    args = parser.parse_args()
    if args.worker:
        method, path = args.worker
        if method == "make":
            write_linears(Path(path), args.layers)
            print("{}")
        else:
            print(json.dumps(load(method, Path(path), args.layers)))
        return
    with tempfile.TemporaryDirectory(dir=_HERE) as tmp:
        worker(__file__, "make", tmp, "--layers", str(args.layers))
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
        for _ in range(args.repeat):
            for method, (file, _label) in METHODS.items():
                path = Path(tmp) / file
                warm(path)
                runs[method].append(worker(__file__, method, str(path), "--layers",
                                           str(args.layers)))
    sums = {m: {r["checksum"] for r in rs} for m, rs in runs.items() if m != "floor"}
    assert len(set().union(*sums.values())) == 1, sums
    result = {m: median_of(rs, "seconds", "peak_rss") for m, rs in runs.items()}
    gib = 2**30
    for method, (_file, label) in METHODS.items():
        r = result[method]
        print(f"{label:<50} {r['seconds']:6.3f} s  peak RSS {r['peak_rss'] / gib:5.2f} GiB")
        steps = sorted(runs[method], key=lambda run: run["seconds"])[len(runs[method]) // 2][
            "steps"]  # the median run's
        if steps:
            print("    steps: " + ", ".join(f"{k} {v:.3f}" for k, v in steps.items() if v))
    for ours, theirs in (("graft_safetensors", "load_model"), ("graft_torch", "torch_mmap")):
        time_ratio = pair_ratios(runs[ours], runs[theirs])
        rss_ratio = result[ours]["peak_rss"] / result[theirs]["peak_rss"]
        met = time_ratio <= 0.8 and rss_ratio <= 0.6
        print(f"{ours} vs {theirs}: time {time_ratio:.2f} (<= 0.8), RSS {rss_ratio:.2f} "
              f"(<= 0.6): {'met' if met else 'NOT met'}")
        print(f"    {ours} vs the floor {pair_ratios(runs[ours], runs['floor']):.2f}; the floor "
              f"vs {theirs} {pair_ratios(runs['floor'], runs[theirs]):.2f} (the least any "
              "copy can be)")


if __name__ == "__main__":
    main()
