"""Build on the meta device and load, end to end: torchgraft vs the expert way, side by side.

Target (the performance issue, 2): ``tg.graft`` into a model built under
``torch.device("meta")`` at most 1.0x the wall time of the expert way, meta model +
``torch.load(path, mmap=True, weights_only=True)`` + ``load_state_dict(state, assign=True)``,
with the weights real and readable afterwards: the time runs until every weight has been read
once (a checksum, which must agree between the sides; mmap defers reading to it). The
checkpoint holds 256 ``nn.Linear(1024, 1024)`` weights (1 GiB). Each side: fresh process, page
cache warmed first, alternating sides; the ratio is the median of the per-pair ratios.

Run: python bench/meta_load.py [--layers 256] [--repeat 3]
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
    warm,
    worker,
)

METHODS = ("expert", "torchgraft")


def load(method: str, path: Path, layers: int) -> dict[str, float]:
    import torchgraft as tg

    graft = tg.graft  # imported before the clock starts, as torch is
    start = time.perf_counter()
    model = linears(layers, "meta")
    if method == "expert":
        model.load_state_dict(torch.load(path, mmap=True, weights_only=True), assign=True)
    else:
        assert graft(path, model, strict=True).ok
    total = checksum(model)
    seconds = time.perf_counter() - start  # end to end: every weight read once
    return {"seconds": seconds, "peak_rss": peak_rss(), "checksum": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "PATH"))
    args = parser.parse_args()
    if args.worker:
        method, path = args.worker
        if method == "make":
            torch.manual_seed(0)
            torch.save(linears(args.layers).state_dict(), path)
            print("{}")
        else:
            print(json.dumps(load(method, Path(path), args.layers)))
        return
    with tempfile.TemporaryDirectory(dir=_HERE) as tmp:
        path = Path(tmp) / "linears.pt"
        worker(__file__, "make", str(path), "--layers", str(args.layers))
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
        for _ in range(args.repeat):
            for method in METHODS:
                warm(path)
                runs[method].append(worker(__file__, method, str(path), "--layers",
                                           str(args.layers)))
    sums = {m: {r["checksum"] for r in rs} for m, rs in runs.items()}
    assert len(sums["expert"]) == 1 and sums["expert"] == sums["torchgraft"], sums
    result = {m: median_of(rs, "seconds", "peak_rss") for m, rs in runs.items()}
    gib = 2**30
    for label, method in (("meta + torch.load(mmap=True) + load_state_dict(assign=True)",
                           "expert"), ("meta + tg.graft(path, model)", "torchgraft")):
        r = result[method]
        print(f"{label:<62} {r['seconds']:6.3f} s  peak RSS {r['peak_rss'] / gib:5.2f} GiB")
    ratio = pair_ratios(runs["torchgraft"], runs["expert"])
    rss = result["torchgraft"]["peak_rss"] / result["expert"]["peak_rss"]
    met = ratio <= 1.0 and rss <= 1.0
    print(f"time ratio {ratio:.2f} (median of pairs, target <= 1.0), peak RSS ratio {rss:.2f} "
          f"(<= 1.0): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
