"""Graft into an FSDP2 model on 2 and 4 ranks: each rank's memory, bytes read, and wall time.

Target (issues: sharded grafts, 28): each rank's peak memory for the load at most
1.2 x (file size / ranks) + the largest adapted tensor (none here: the names match, or differ
by DataParallel's ``module.``), reading about its share of the file, from a safetensors file,
from a ``.pt`` of a DataParallel state dict, and from a ``.pt`` whose tensors were saved
transposed (``w.t()``: column-major strides; each rank read them whole through the file's
mapping, 386 MiB per rank for a 256 MiB file on 2 ranks, until issue 34: now 151 / 142 MiB,
bound 154, on the 2-core development machine under load 5, ``--layers 64 --ranks 2``). The
model is ``--layers`` x ``Linear(1024, 1024)`` (4 MiB each; 256 layers: a 1 GiB file), built
on the meta device and wrapped with ``fully_shard`` (gloo, CPU). Sides, each a fresh
``torch.distributed.run`` launch with the page cache warmed first, alternating:

* ``torchgraft``: ``tg.graft(path, model)``; every rank reads its rows of every tensor;
* ``broadcast``: torch's ``set_model_state_dict(model, <the whole file read on rank 0>,
  StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))``;
* ``hf_reader`` (safetensors only): ``dcp.load(model.state_dict(),
  storage_reader=HuggingFaceStorageReader(dir))`` after ``model.to_empty(device="cpu")``
  (DCP's reader of safetensors folders; it applies here because the names match exactly).

The clock runs from building the model to every rank holding its weights; the checksum of
the whole model (a collective) must agree between the sides. Memory, measured in each rank:
its high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs`` once the sharded meta
model is built, so nothing before the load counts) less its RSS at that point. It is measured
twice: once the weights are loaded, and after a first forward pass. The forward's all-gathers
allocate each layer's whole weight and free it; glibc keeps such freed blocks in the heap once
a large block was freed (its dynamic mmap threshold), so the second figure grows by up to the
model's size on any side, whatever loaded the weights (``MALLOC_MMAP_THRESHOLD_=65536`` makes
it a few MiB): the load is the first figure. Bytes read: the growth of ``rchar`` in
``/proc/self/io`` (read system calls; pages of a memory-mapped file are not counted there but
are in the RSS). Wall ratios: median of the per-pair ratios over ``--repeat`` pairs.

Run: python bench/sharded.py [--layers 256] [--ranks 2 4] [--formats safetensors pt]
[--repeat 3]
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

from harness import (  # noqa: E402
    linears,
    peak_rss,
    peak_since_reset,
    reset_peak,
    rss_now,
    warm,
)

METHODS = ("torchgraft", "broadcast", "hf_reader")
FILES = {"safetensors": "model.safetensors", "pt": "dp.pt", "pt_transposed": "transposed.pt"}
MiB = 1 << 20


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def load(method: str, path: Path, layers: int) -> None:
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
    tg.open(path).close()  # torchgraft's readers imported too
    dist.barrier()
    start = time.perf_counter()
    model = linears(layers, "meta")
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # the sharded meta model, before any weight; the high-water mark counts from here
    hwm = reset_peak()
    before, read_before = rss_now(), _rchar()
    if method == "torchgraft":
        assert tg.graft(path, model, strict=path.suffix == ".safetensors").ok
    elif method == "broadcast":
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        full: dict[str, torch.Tensor] = {}
        if dist.get_rank() == 0:
            full = load_file(path) if path.suffix == ".safetensors" else {
                k.removeprefix("module."): v
                for k, v in torch.load(path, mmap=True, weights_only=True).items()}
        set_model_state_dict(model, full, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True))
        del full
    else:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageReader

        model.to_empty(device="cpu")
        dcp.load(model.state_dict(), storage_reader=HuggingFaceStorageReader(str(path.parent)))
    local = sum(float(p.detach().to_local().sum(dtype=torch.float64))
                for p in model.parameters() if isinstance(p, DTensor))
    dist.barrier()
    seconds = time.perf_counter() - start
    loaded = (peak_since_reset() if hwm else peak_rss()) - before
    with torch.no_grad():
        model(torch.randn(2, 1024))
    ran = (peak_since_reset() if hwm else peak_rss()) - before
    mine = {"peak": loaded, "ran": ran, "read": _rchar() - read_before, "sum": local}
    every: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, mine)
    if dist.get_rank() == 0:
        print(json.dumps({"seconds": seconds, "peak": [r["peak"] for r in every],
                          "ran": [r["ran"] for r in every],
                          "read": [r["read"] for r in every],
                          "checksum": sum(r["sum"] for r in every)}))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # now and then a C++ destructor at exit aborted a rank (see the README)


def launch(method: str, path: Path, layers: int, ranks: int) -> dict[str, object]:
    warm(path)
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={ranks}", __file__, "--worker", method, str(path), str(layers)],
        check=False, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode:
        raise SystemExit(f"{method} on {ranks} ranks failed:\n{out.stderr[-3000:]}")
    return json.loads(next(line for line in reversed(out.stdout.splitlines())  # type: ignore[no-any-return]
                           if line.startswith("{")))


def _table(runs: dict[str, list[dict[str, object]]], ranks: int) -> None:
    print("| side | wall s (median) | vs torchgraft (median of pair ratios) | "
          "peak RSS per rank, MiB (max over runs) | ... and after a first forward | "
          "bytes read per rank, MiB |")
    print("|---|---|---|---|---|---|")
    for method, results in runs.items():
        seconds = [float(r["seconds"]) for r in results]  # type: ignore[arg-type]
        ratio = statistics.median(
            float(a["seconds"]) / float(b["seconds"])  # type: ignore[arg-type]
            for a, b in zip(results, runs["torchgraft"], strict=True))

        def most(key: str, rank: int, of: list[dict[str, object]] = results) -> int:
            return max(int(r[key][rank]) for r in of)  # type: ignore[index]

        reads = [int(results[-1]["read"][k]) for k in range(ranks)]  # type: ignore[index]
        loaded = " / ".join(f"{most('peak', k) / MiB:.0f}" for k in range(ranks))
        ran = " / ".join(f"{most('ran', k) / MiB:.0f}" for k in range(ranks))
        print(f"| {method} | {statistics.median(seconds):.2f} | {ratio:.2f}x | {loaded} | "
              f"{ran} | {' / '.join(f'{r / MiB:.0f}' for r in reads)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=256)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--formats", nargs="+", default=list(FILES), choices=list(FILES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "PATH", "LAYERS"))
    args = parser.parse_args()
    if args.worker:
        method, path, layers = args.worker
        load(method, Path(path), int(layers))
        return
    import torch
    from safetensors.torch import save_model
    from torch import nn

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        torch.manual_seed(0)
        model = linears(args.layers)
        save_model(model, str(folder / FILES["safetensors"]))
        torch.save(nn.DataParallel(model).state_dict(), folder / FILES["pt"])
        torch.save({k: v.t().contiguous().t() for k, v in model.state_dict().items()},
                   folder / FILES["pt_transposed"])  # saved transposed: column-major strides
        del model
        size = (folder / FILES["safetensors"]).stat().st_size
        print(f"file {size / MiB:.0f} MiB, {args.layers} tensors of 4 MiB; "
              f"uptime: {os.getloadavg()}")
        for fmt in args.formats:
            path = folder / FILES[fmt]
            methods = [m for m in METHODS if fmt == "safetensors" or m != "hf_reader"]
            for ranks in args.ranks:
                runs: dict[str, list[dict[str, object]]] = {m: [] for m in methods}
                for _ in range(args.repeat):
                    for method in methods:
                        runs[method].append(launch(method, path, args.layers, ranks))
                sums = {m: round(float(r[0]["checksum"]), 3)  # type: ignore[arg-type]
                        for m, r in runs.items()}
                assert len(set(sums.values())) == 1, sums
                bound = 1.2 * size / ranks
                print(f"\n{path.name}, {ranks} ranks (bound per rank: 1.2 x file/ranks + the "
                      f"largest adapted tensor, none = {bound / MiB:.0f} MiB); load average "
                      f"{os.getloadavg()}")
                _table(runs, ranks)


if __name__ == "__main__":
    main()
