"""Converting a 1 GiB torch checkpoint to safetensors: tg.convert vs the plain way, side by side.

Target (issue 4): peak RSS at most 0.4x and wall time at most 1.0x those of
``safetensors.torch.save_file(torch.load(path, weights_only=True), out)``. The checkpoint
holds 256 ``Linear(1024, 1024)`` weights. Each method runs in a fresh process (peak RSS is a
process's high-water mark, and a child inherits its parent's, so this parent stays small and
even the input is written by a child); the input is in the page cache for both.

Run: python bench/convert.py [--layers 256] [--repeat 2] [--json]
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

METHODS = ("save_file(torch.load(...))", "tg.convert")


def worker(method: str, src: Path, dst: Path) -> dict[str, float]:
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    if method == METHODS[0]:
        from safetensors.torch import save_file

        save_file(torch.load(src, weights_only=True), dst)
    else:
        import torchgraft as tg

        tg.convert(src, dst)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"seconds": seconds, "peak_rss": peak, "rss_before": baseline}


def run(method: str, src: Path, dst: Path) -> dict[str, float]:
    dst.unlink(missing_ok=True)
    out = subprocess.run([sys.executable, __file__, "--worker", method, "--src", str(src),
                          "--dst", str(dst)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", choices=[*METHODS, "make"])
    parser.add_argument("--src", type=Path)
    parser.add_argument("--dst", type=Path)
    args = parser.parse_args()
    if args.worker == "make":
        torch.manual_seed(0)
        torch.save({f"layers.{i}.weight": torch.randn(1024, 1024) for i in range(args.layers)},
                   args.dst)
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.src, args.dst)))
        return
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as tmp:
        src = Path(tmp) / "linears.pt"
        # Written by a child process: a child inherits its parent's peak RSS, so the parent
        # must never hold the weights.
        subprocess.run([sys.executable, __file__, "--worker", "make", "--dst", str(src),
                        "--layers", str(args.layers)], check=True)
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
        outputs = {m: Path(tmp) / f"out{i}.safetensors" for i, m in enumerate(METHODS)}
        for _ in range(args.repeat):
            for method in METHODS:
                runs[method].append(run(method, src, outputs[method]))
        a, b = (load_file(outputs[m]) for m in METHODS)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "outputs differ"
        size = src.stat().st_size
    result: dict[str, object] = {"file_bytes": size}
    for method, rs in runs.items():
        result[method] = {"seconds": statistics.median(r["seconds"] for r in rs),
                          "peak_rss": statistics.median(r["peak_rss"] for r in rs),
                          "rss_before": statistics.median(r["rss_before"] for r in rs)}
    base, ours = result[METHODS[0]], result[METHODS[1]]
    assert isinstance(base, dict) and isinstance(ours, dict)
    result["rss_ratio"] = ours["peak_rss"] / base["peak_rss"]
    result["time_ratio"] = ours["seconds"] / base["seconds"]
    if args.json:
        print(json.dumps(result, indent=2))
        return
    gib = 2**30
    print(f"checkpoint: {size / gib:.2f} GiB ({args.layers} x Linear(1024, 1024)), "
          "torch zip -> safetensors")
    print(f"{'method':<40} {'peak RSS':>10} {'time':>8}   (RSS before the call)")
    for method, row in ((METHODS[0], base), (METHODS[1], ours)):
        print(f"{method:<40} {row['peak_rss'] / gib:>7.2f}GiB {row['seconds']:>7.2f}s   "
              f"({row['rss_before'] / 2**20:.0f} MiB)")
    met = result["rss_ratio"] <= 0.4 and result["time_ratio"] <= 1.0  # type: ignore[operator]
    print(f"ratios: RSS {result['rss_ratio']:.2f} (target <= 0.4), time "
          f"{result['time_ratio']:.2f} (target <= 1.0): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
