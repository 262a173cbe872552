"""What the benches share: fresh worker processes, a warm page cache, medians.

Peak RSS is a process's high-water mark and a child inherits its parent's, so each side of a
comparison runs in its own fresh process and the parent never holds the weights. The file is
read once before each run, so both sides start with it in the page cache.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["checksum", "evict", "files_of", "linears", "median_of", "pair_ratios", "peak_rss",
           "peak_since_reset", "reset_peak", "resident", "rss_now", "timed_steps", "warm",
           "worker", "write_linears"]


def files_of(path: Path) -> list[Path]:
    """A file, or every file in a folder."""
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def warm(path: Path) -> None:
    """Read a file (or every file in a folder) so that it is in the page cache."""
    for file in files_of(path):
        with file.open("rb") as f:
            while f.read(1 << 24):
                pass


def evict(path: Path) -> None:
    """Drop a file's (or a folder's files') pages from the page cache: a cold read follows.

    ``posix_fadvise(DONTNEED)`` needs no root (unlike ``drop_caches``) and touches only these
    files; dirty pages are written first. Where the file system keeps files in memory (tmpfs)
    the pages stay: :func:`resident` tells.
    """
    for file in files_of(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(path: Path) -> float:
    """The fraction of a file's (or a folder's files') pages in the page cache (``mincore``)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    held = total = 0
    for file in files_of(path):
        size = file.stat().st_size
        if not size:
            continue
        with file.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as view:
            pages = -(-size // page)
            vector = (ctypes.c_ubyte * pages)()
            first = ctypes.c_char.from_buffer(view)  # copy-on-write: nothing is touched
            failed = libc.mincore(ctypes.c_void_p(ctypes.addressof(first)),
                                  ctypes.c_size_t(size), vector)
            del first
            if failed:
                return float("nan")
            held += sum(v & 1 for v in vector)
            total += pages
    return held / total if total else 1.0


def rss_now() -> int:
    """This process's resident memory now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> bool:
    """Start this process's high-water mark again from its RSS now (Linux 4.0+)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_since_reset() -> int:
    """This process's high-water mark since :func:`reset_peak` (``VmHWM``), in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))


def worker(script: str, *args: str) -> dict[str, Any]:
    """Run ``script --worker ...`` in a fresh process; return the JSON it printed last."""
    out = subprocess.run([sys.executable, script, "--worker", *args], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def median_of(runs: list[dict[str, Any]], *keys: str) -> dict[str, float]:
    """The median of each key over several runs."""
    return {key: statistics.median(float(r[key]) for r in runs) for key in keys}


def linears(layers: int, device: str = "cpu") -> Any:
    """The benches' model: ``layers`` x ``Linear(1024, 1024)`` without bias, 4 MiB each."""
    import torch
    from torch import nn

    with torch.device(device):
        return nn.Sequential(*(nn.Linear(1024, 1024, bias=False) for _ in range(layers)))


def write_linears(folder: Path, layers: int) -> None:
    """Write the same random model as ``linears.safetensors`` and ``linears.pt``."""
    import torch
    from safetensors.torch import save_model

    torch.manual_seed(0)
    model = linears(layers)
    save_model(model, str(folder / "linears.safetensors"))
    torch.save(model.state_dict(), folder / "linears.pt")


def checksum(model: Any) -> float:
    """A sum over every weight (float64): reads each one, and must agree between methods."""
    import torch

    return float(sum(float(p.sum(dtype=torch.float64)) for p in model.parameters()))


def peak_rss() -> int:
    """This process's peak resident memory in bytes."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def pair_ratios(ours: list[dict[str, Any]], theirs: list[dict[str, Any]],
                key: str = "seconds") -> float:
    """The median of the per-pair ratios ``ours[i][key] / theirs[i][key]``.

    Sides run alternately, so each pair saw the same load on the machine; the median of
    their ratios is steadier than the ratio of medians on a shared machine.
    """
    return statistics.median(float(a[key]) / float(b[key])
                             for a, b in zip(ours, theirs, strict=True))


#: Steps of tg.graft timed by :func:`timed_steps`: the module that calls each, and its name.
STEPS = (("api", "walk_model"), ("api", "open_source"), ("api", "module_side"),
         ("api", "describe_sides"), ("plan.build", "add_virtual"),
         ("plan.build", "add_experts"), ("plan.build", "build_plan"),
         ("fill.target", "materialise"), ("fill.target", "execute_plan"),
         ("fill.target", "confirm_writes"), ("fill.target", "initialise_left"),
         ("api", "_report"))


def timed_steps() -> dict[str, float]:
    """Wrap the graft's steps (as tg.graft calls them); the dict fills with seconds spent."""
    import importlib
    import time

    spent: dict[str, float] = {step: 0.0 for _caller, step in STEPS}
    for caller, step in STEPS:
        module = importlib.import_module(f"torchgraft.graft.{caller}")
        original = getattr(module, step)

        def wrapped(*args: Any, _f: Any = original, _s: str = step, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return _f(*args, **kwargs)
            finally:
                spent[_s] += time.perf_counter() - start

        setattr(module, step, wrapped)
    return spent


def warm_graft(folder: Path) -> None:
    """Graft a one-tensor file first: the modules a graft imports on first use are loaded
    before the clock starts, as the libraries of the other sides are."""
    import torch
    from safetensors.torch import save_file
    from torch import nn

    import torchgraft as tg

    path = folder / f"warm-{os.getpid()}.safetensors"
    save_file({"weight": torch.zeros(2, 2)}, path)
    with torch.device("meta"):
        model = nn.Linear(2, 2, bias=False)
    tg.graft(path, model)
    path.unlink()
