"""Start-up time of the command line: ``--help``, ``--version`` and ``inspect`` of small files.

Before the commands were imported lazily, every start imported torch (2-3 s on a 2-core
machine); this compares each command line with ``python -c "import torch"``, the cost it no
longer pays. ``torchgraft inspect`` of a safetensors, NumPy, torch.save state-dict file or a
DCP folder reads its header without importing torch (target: <= 0.5 s); a training checkpoint
still goes through the full reader, with torch. Median of several fresh processes each (the
interpreter's files are warm after the first run, which is discarded).

    python bench/startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _median_seconds(command: list[str], runs: int) -> float:
    times = []
    for k in range(runs + 1):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        if k:  # the first run warms the page cache
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    """Print one line per command line timed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "torchgraft"]
    with tempfile.TemporaryDirectory() as tmp:
        files = _files(Path(tmp))
        cases = {"torchgraft --help": [*cli, "--help"],
                 "torchgraft --version": [*cli, "--version"],
                 **{f"torchgraft inspect {p.name}": [*cli, "inspect", str(p)] for p in files},
                 "python -c 'import torch' (the old floor)": [sys.executable, "-c",
                                                              "import torch"]}
        for label, command in cases.items():
            print(f"{label:<48} {_median_seconds(command, args.runs):.3f} s "
                  f"(median of {args.runs})")


def _files(folder: Path) -> list[Path]:
    """A ResNet-sized state dict as safetensors, torch.save and npz; a training checkpoint."""
    here = Path(__file__).resolve().parent  # bench/inspect.py would shadow the stdlib's inspect
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    import numpy as np
    import torch
    from safetensors.torch import save_file

    state = {f"layer{i}.weight": torch.randn(256, 256) for i in range(60)}
    save_file(state, folder / "model.safetensors")
    torch.save(state, folder / "model.pt")
    np.savez(folder / "model.npz", **{k: v.numpy() for k, v in state.items()})
    torch.save({"epoch": 1, "state_dict": state}, folder / "training.ckpt")
    from torch.distributed.checkpoint import save

    save(state, checkpoint_id=str(folder / "dcp"))
    return [folder / n for n in ("model.safetensors", "model.pt", "model.npz", "dcp",
                                 "training.ckpt")]


if __name__ == "__main__":
    main()
