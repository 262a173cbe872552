"""Converting a 1 GiB torch checkpoint to safetensors, against copying the same bytes.

Target: ``tg.convert`` at most 1.5x the wall time of ``shutil.copyfile`` plus ``fsync`` of
the same file (the floor: a convert must write every byte, and tg.convert always fsyncs), with
peak RSS at most 0.25x of the file; ``save_file(torch.load(path))``, the usual
way, is shown too. The checkpoint holds 256 ``Linear(1024, 1024)`` weights. Each method runs
in a fresh process, the page cache warmed and earlier writes flushed (``sync``) before each
run, methods alternating; the ratio is the median of the per-pair ratios. Every method's
output is fsynced (``tg.convert`` always is).

Run: python bench/convert.py [--layers 256] [--repeat 3] [--json]
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
import os  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from harness import median_of, pair_ratios, warm, worker  # noqa: E402

METHODS = {
    "copyfile": "shutil.copyfile + fsync (the floor)",
    "save_file": "save_file(torch.load(path)) + fsync",
    "convert": "tg.convert(path, out)",
}


def _fsync(path: Path) -> None:
    with path.open("rb+") as f:
        os.fsync(f.fileno())


def run_method(method: str, src: Path, dst: Path) -> dict[str, float]:
    """One timed run in this (fresh) process; imports are not timed."""
    from safetensors.torch import save_file

    import torchgraft as tg

    convert = tg.convert  # imported before the clock starts, as torch and safetensors are
    dst.unlink(missing_ok=True)
    start = time.perf_counter()
    if method == "copyfile":
        shutil.copyfile(src, dst)
        _fsync(dst)
    elif method == "save_file":
        save_file(torch.load(src, weights_only=True), dst)
        _fsync(dst)
    else:
        convert(src, dst)
    seconds = time.perf_counter() - start
    return {"seconds": seconds,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def main() -> None:
    """Write the checkpoint, run every method, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "SRC", "DST"))
    parser.add_argument("--make", type=Path)
    args = parser.parse_args()
    if args.make:
        torch.manual_seed(0)
        torch.save({f"layers.{i}.weight": torch.randn(1024, 1024) for i in range(args.layers)},
                   args.make)
        return
    if args.worker:
        method, src, dst = args.worker
        print(json.dumps(run_method(method, Path(src), Path(dst))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "linears.pt"
        # Written by a child: a child inherits its parent's peak RSS, so the parent never
        # holds the weights.
        import subprocess

        subprocess.run([sys.executable, __file__, "--make", str(src), "--layers",
                        str(args.layers)], check=True)
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
        for _ in range(args.repeat):
            for method in METHODS:
                warm(src)
                os.sync()  # no writeback of an earlier run pending: each side starts clean
                runs[method].append(worker(__file__, method, str(src),
                                           str(Path(tmp) / f"{method}.safetensors")))
        from safetensors.torch import load_file

        a, b = (load_file(Path(tmp) / f"{m}.safetensors") for m in ("save_file", "convert"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "differ"
        size = src.stat().st_size
    result: dict[str, object] = {"file_bytes": size}
    for method, rs in runs.items():
        result[method] = median_of(rs, "seconds", "peak_rss")
    floor, ours = result["copyfile"], result["convert"]
    assert isinstance(floor, dict) and isinstance(ours, dict)
    result["time_vs_copy"] = pair_ratios(runs["convert"], runs["copyfile"])
    result["rss_vs_file"] = ours["peak_rss"] / size
    if args.json:
        print(json.dumps(result, indent=2))
        return
    gib = 2**30
    print(f"checkpoint: {size / gib:.2f} GiB ({args.layers} x Linear(1024, 1024)), "
          f"torch zip -> safetensors, median of {args.repeat}")
    print(f"{'method':<40} {'peak RSS':>10} {'time':>8}")
    for method, label in METHODS.items():
        row = result[method]
        assert isinstance(row, dict)
        print(f"{label:<40} {row['peak_rss'] / gib:>7.2f}GiB {row['seconds']:>7.2f}s")
    met = result["time_vs_copy"] <= 1.5 and result["rss_vs_file"] <= 0.25  # type: ignore[operator]
    print(f"tg.convert: time {result['time_vs_copy']:.2f}x the copy (target <= 1.5), peak RSS "
          f"{result['rss_vs_file']:.2f}x the file (target <= 0.25): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
