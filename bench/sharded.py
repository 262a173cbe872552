"""Graft into an FSDP2 model on 2 and 4 ranks: each rank's memory, bytes read, and wall time.

Target (issue: sharded grafts): each rank's peak memory for the load at most
1.2 x (file size / ranks) + the largest tensor, reading about its share of the file. The model
is ``--layers`` x ``Linear(1024, 1024)`` (4 MiB each; 256 layers: a 1 GiB safetensors file),
built on the meta device and wrapped with ``fully_shard`` (gloo, CPU). Sides, each a fresh
``torch.distributed.run`` launch with the page cache warmed first, alternating:

* ``torchgraft``: ``tg.graft(path, model)``; every rank reads its rows of every tensor;
* ``broadcast``: torch's ``set_model_state_dict(model, load_file(path) on rank 0,
  StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))``;
* ``hf_reader``: ``dcp.load(model.state_dict(), storage_reader=HuggingFaceStorageReader(dir))``
  after ``model.to_empty(device="cpu")`` (DCP's reader of safetensors folders; it applies
  here because the names match exactly).

The clock runs from building the model to every rank holding its weights; the checksum of
the whole model (a collective) must agree between the sides. Memory: each rank's peak RSS
during the load less its RSS with the meta model built (before any weight); bytes read: the
growth of ``rchar`` in ``/proc/self/io`` (read system calls; pages of a memory-mapped file
are not counted there but are in the RSS). Wall ratios: median of the per-pair ratios over
``--repeat`` pairs.

Run: python bench/sharded.py [--layers 256] [--ranks 2 4] [--repeat 3]
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
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from harness import linears, peak_rss, warm  # noqa: E402

METHODS = ("torchgraft", "broadcast", "hf_reader")
MiB = 1 << 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def load(method: str, folder: Path, layers: int) -> None:
    """One rank's side of a run; rank 0 prints every rank's figures as one JSON line."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint  # every side's modules imported before the clock
    import torch.distributed.checkpoint.state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    import torchgraft as tg
    import torchgraft.graft.api

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    tg.open(folder / "model.safetensors").close()  # torchgraft's readers imported too
    path = folder / "model.safetensors"
    dist.barrier()
    start = time.perf_counter()
    model = linears(layers, "meta")
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    before, read_before = _rss(), _rchar()  # the sharded meta model, before any weight
    if method == "torchgraft":
        assert tg.graft(path, model, strict=True).ok
    elif method == "broadcast":
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        full = load_file(path) if dist.get_rank() == 0 else {}
        set_model_state_dict(model, full, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True))
        del full
    else:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageReader

        model.to_empty(device="cpu")
        dcp.load(model.state_dict(), storage_reader=HuggingFaceStorageReader(str(folder)))
    local = sum(float(p.detach().to_local().sum(dtype=torch.float64))
                for p in model.parameters() if isinstance(p, DTensor))
    dist.barrier()
    seconds = time.perf_counter() - start
    mine = {"peak": peak_rss() - before, "read": _rchar() - read_before, "sum": local}
    every: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, mine)
    if dist.get_rank() == 0:
        print(json.dumps({"seconds": seconds, "peak": [r["peak"] for r in every],
                          "read": [r["read"] for r in every],
                          "checksum": sum(r["sum"] for r in every)}))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # now and then a C++ destructor at exit aborted a rank (see the README)


def launch(method: str, folder: Path, layers: int, ranks: int) -> dict[str, object]:
    warm(folder)
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={ranks}", __file__, "--worker", method, str(folder), str(layers)],
        check=False, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode:
        raise SystemExit(f"{method} on {ranks} ranks failed:\n{out.stderr[-3000:]}")
    return json.loads(next(line for line in reversed(out.stdout.splitlines())  # type: ignore[no-any-return]
                           if line.startswith("{")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=256)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "FOLDER", "LAYERS"))
    args = parser.parse_args()
    if args.worker:
        method, folder, layers = args.worker
        load(method, Path(folder), int(layers))
        return
    import torch
    from safetensors.torch import save_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        torch.manual_seed(0)
        save_model(linears(args.layers), str(folder / "model.safetensors"))
        size = (folder / "model.safetensors").stat().st_size
        largest = 1024 * 1024 * 4
        print(f"file {size / MiB:.0f} MiB, {args.layers} tensors of {largest / MiB:.0f} MiB; "
              f"uptime: {os.getloadavg()}")
        for ranks in args.ranks:
            runs: dict[str, list[dict[str, object]]] = {m: [] for m in METHODS}
            for _ in range(args.repeat):
                for method in METHODS:
                    runs[method].append(launch(method, folder, args.layers, ranks))
            sums = {m: round(float(r[0]["checksum"]), 3) for m, r in runs.items()}  # type: ignore[arg-type]
            assert len(set(sums.values())) == 1, sums
            bound = 1.2 * size / ranks + largest
            print(f"\n{ranks} ranks (bound per rank: 1.2 x file/ranks + largest = "
                  f"{bound / MiB:.0f} MiB)")
            print("| side | wall s (median) | vs torchgraft (median of pair ratios) | "
                  "peak RSS per rank, MiB (max over runs) | bytes read per rank, MiB |")
            print("|---|---|---|---|---|")
            for method in METHODS:
                seconds = [float(r["seconds"]) for r in runs[method]]  # type: ignore[arg-type]
                ratio = statistics.median(
                    float(a["seconds"]) / float(b["seconds"])  # type: ignore[arg-type]
                    for a, b in zip(runs[method], runs["torchgraft"], strict=True))
                peaks = [max(int(r["peak"][k]) for r in runs[method])  # type: ignore[index]
                         for k in range(ranks)]
                reads = [int(runs[method][-1]["read"][k]) for k in range(ranks)]  # type: ignore[index]
                print(f"| {method} | {statistics.median(seconds):.2f} | {ratio:.2f}x | "
                      f"{' / '.join(f'{p / MiB:.0f}' for p in peaks)} | "
                      f"{' / '.join(f'{r / MiB:.0f}' for r in reads)} |")


if __name__ == "__main__":
    main()
