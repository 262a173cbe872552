"""Inspecting a 1 GiB checkpoint vs torch.load on the same file, side by side in one run.

Target (issue 2): tg.inspect takes at most 0.05x the time of torch.load, and reads none of the
tensor bytes. "bytes read" is the process's rchar (bytes passed through read syscalls), from
/proc/self/io. The file is in the page cache for both (written just before), so the times
compare CPU work, not the disk.

Run: python bench/inspect.py [--gib 1.0] [--repeat 3] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named inspect.py: keep its folder off sys.path so that `import inspect` (done by
# torch) finds the standard library.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import torchgraft as tg  # noqa: E402


def bytes_read() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def measure(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    fn()  # warm up: imports and first-call costs are not what is compared
    times, reads = [], []
    for _ in range(repeat):
        before_read, start = bytes_read(), time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        reads.append(bytes_read() - before_read)
        del result
    return {"seconds": statistics.median(times), "bytes_read": statistics.median(reads)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    layers = int(256 * args.gib)
    rows = []
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as tmp:
        state = {f"layers.{i}.weight": torch.randn(1024, 1024) for i in range(layers)}
        files = {"torch-zip": Path(tmp) / "zip.pt", "torch-legacy": Path(tmp) / "legacy.pt",
                 "safetensors": Path(tmp) / "model.safetensors"}
        torch.save(state, files["torch-zip"])
        torch.save(state, files["torch-legacy"], _use_new_zipfile_serialization=False)
        save_file(state, files["safetensors"])
        del state
        for fmt, path in files.items():
            size = path.stat().st_size
            ours = measure(lambda p=path: tg.inspect(p), args.repeat)
            if fmt == "safetensors":
                baseline_name = "safetensors.torch.load_file"
                baseline = measure(lambda p=path: load_file(p), args.repeat)
            else:
                baseline_name = "torch.load(weights_only=True)"
                baseline = measure(lambda p=path: torch.load(p, weights_only=True), args.repeat)
            rows.append({
                "format": fmt, "file_bytes": size, "baseline": baseline_name,
                "tg_inspect_s": ours["seconds"], "baseline_s": baseline["seconds"],
                "time_ratio": ours["seconds"] / baseline["seconds"],
                "tg_inspect_bytes_read": ours["bytes_read"],
                "baseline_bytes_read": baseline["bytes_read"],
            })
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'format':<13} {'file':>9} {'tg.inspect':>11} {'baseline':>9} {'ratio':>7} "
          f"{'inspect read':>13} {'baseline read':>14}  baseline")
    for r in rows:
        print(f"{r['format']:<13} {r['file_bytes'] / 2**30:>7.2f}Gi {r['tg_inspect_s']:>10.4f}s "
              f"{r['baseline_s']:>8.3f}s {r['time_ratio']:>7.4f} "
              f"{r['tg_inspect_bytes_read'] / 1024:>10.1f}KiB "
              f"{r['baseline_bytes_read'] / 2**20:>10.1f}MiB  {r['baseline']}")
    zip_row = next(r for r in rows if r["format"] == "torch-zip")
    met = zip_row["time_ratio"] <= 0.05 and zip_row["tg_inspect_bytes_read"] < 2**20
    print(f"target (torch-zip: time ratio <= 0.05, no tensor bytes read): "
          f"{'met' if met else 'NOT met'}")
    print("safetensors' load_file memory-maps without reading, so its row is for reference.")


if __name__ == "__main__":
    main()
