"""Grafting a 1 GiB checkpoint into a built model vs load_state_dict(torch.load(...)), side by side.

Target (issue 3): peak RSS at most 0.6x and wall time at most 0.5x those of
``model.load_state_dict(torch.load(path, weights_only=True))``. The checkpoint holds the weights
of 256 ``nn.Linear(1024, 1024)``. Each method runs in a fresh process (peak RSS is a process's
high-water mark, and a child inherits its parent's, so this parent stays small and even the
checkpoint is written by a child), after building the same model; only the load is timed. The
file is in the page cache for both.

Run: python bench/graft_memory.py [--layers 256] [--repeat 2] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/inspect.py would shadow the standard library's inspect (imported by torch).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402


def build(layers: int) -> nn.Module:
    return nn.Sequential(*(nn.Linear(1024, 1024, bias=False) for _ in range(layers)))


def worker(method: str, path: Path, layers: int) -> dict[str, float]:
    model = build(layers)
    start = time.perf_counter()
    if method == "torch.load":
        model.load_state_dict(torch.load(path, weights_only=True))
    else:
        import torchgraft as tg

        report = tg.graft(path, model, strict=True)
        assert report.ok
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    checksum = float(sum(float(p[0, :4].sum()) for p in model.parameters()))
    return {"seconds": seconds, "peak_rss": peak, "checksum": checksum}


def run(method: str, path: Path, layers: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--worker", method, "--path", str(path),
                          "--layers", str(layers)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", choices=["torch.load", "torchgraft", "make"])
    parser.add_argument("--path", type=Path)
    args = parser.parse_args()
    if args.worker == "make":
        torch.manual_seed(0)
        torch.save(build(args.layers).state_dict(), args.path)
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.path, args.layers)))
        return
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as tmp:
        path = Path(tmp) / "linears.pt"
        # Written by a child process: a child inherits its parent's peak RSS, so the parent
        # must never hold the weights.
        subprocess.run([sys.executable, __file__, "--worker", "make", "--path", str(path),
                        "--layers", str(args.layers)], check=True)
        runs: dict[str, list[dict[str, float]]] = {"torch.load": [], "torchgraft": []}
        for _ in range(args.repeat):
            for method in runs:
                runs[method].append(run(method, path, args.layers))
        size = path.stat().st_size
    checksums = {m: {r["checksum"] for r in rs} for m, rs in runs.items()}
    assert checksums["torch.load"] == checksums["torchgraft"], "the methods loaded different data"
    result = {"file_bytes": size}
    for method, rs in runs.items():
        result[method] = {"seconds": statistics.median(r["seconds"] for r in rs),
                          "peak_rss": statistics.median(r["peak_rss"] for r in rs)}
    base, ours = result["torch.load"], result["torchgraft"]
    result["rss_ratio"] = ours["peak_rss"] / base["peak_rss"]
    result["time_ratio"] = ours["seconds"] / base["seconds"]
    if args.json:
        print(json.dumps(result, indent=2))
        return
    gib = 2**30
    print(f"checkpoint: {size / gib:.2f} GiB ({args.layers} x Linear(1024, 1024))")
    print(f"{'method':<60} {'peak RSS':>10} {'time':>8}")
    print(f"{'model.load_state_dict(torch.load(path, weights_only=True))':<60} "
          f"{base['peak_rss'] / gib:>7.2f}GiB {base['seconds']:>7.2f}s")
    print(f"{'tg.graft(path, model)':<60} {ours['peak_rss'] / gib:>7.2f}GiB "
          f"{ours['seconds']:>7.2f}s")
    met = result["rss_ratio"] <= 0.6 and result["time_ratio"] <= 0.5
    print(f"ratios: RSS {result['rss_ratio']:.2f} (target <= 0.6), time "
          f"{result['time_ratio']:.2f} (target <= 0.5): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
