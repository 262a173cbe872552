"""Loading onto a device at the hardware's pace: tg against the fastest loaders and the limits.

Issue 34. Inputs, written by the libraries' own save functions:

* ``folder``: a bf16 transformers Llama written by ``save_pretrained`` in several shards (4.3
  GiB with ``--size-gib 4``);
* ``file``: one file of equal ``Linear(1024, 1024)`` (4 MiB each, float32) of the same size,
  as ``.safetensors`` and as a torch zip ``.pt``.

Methods, each a fresh process, the model built on the meta device first (not timed), the clock
stopped once every weight is on the device (synchronised; on the CPU, once a byte of every
page of every weight has been read: a memory-mapped tensor is read only when used):

* ``tg``: ``tg.graft(path, model, device=...)`` (``tg_pt``: from the ``.pt``);
* ``load_file``: safetensors' ``load_file(shard, device=...)`` for each shard, then
  ``load_state_dict(assign=True)``; ``torch_load``: ``torch.load(.pt, map_location=...,
  mmap=True)``, the same;
* ``runai``: runai-model-streamer's ``SafetensorsStreamer`` (its threads read into a host
  buffer), each tensor then ``.to(device)`` (a copy of its own on the CPU);
* ``fastsafetensors``: ``SafeTensorsFileLoader(nogds=True)``, ``copy_files_to_device``, each
  tensor a view of its device buffer;
* the two limits, nothing parsed: ``bus``, the checkpoint's size copied from pinned host
  memory to the device in one copy (CUDA only); ``read``, the files read into pinned (on the
  CPU: plain) host buffers by as many threads as tg uses (``READERS``), in pieces of tg's size,
  each thread alternating between two buffers.

Warm and cold page cache: warm reads the files first; cold evicts their pages with
``posix_fadvise(DONTNEED)`` (no root needed) and reports the fraction still resident
(``mincore``; a file system that keeps files in memory cannot be made cold). Rounds interleave
every method, inputs and caches; ratios are the medians of per-round ratios. Host memory: each
process's high-water mark from just before the load (``/proc/self/clear_refs``), less its
resident memory then. End to end (warm): ``from_pretrained(folder, device_map=device)``
against a meta build plus ``tg.graft(..., device=device)``, the logits compared for equality,
and the load part reported apart (for ``from_pretrained``, from a profile of one more run: its
loading functions' cumulative time).

Done when (on an H100 or H200, one run): warm, tg at most 0.5x runai's time on the folder
(or within 1.2x of the read limit where that limit is above it); cold, no slower than the
fastest anchor; host peak at most 0.25x the checkpoint; end to end no slower than
``from_pretrained``, logits equal.

On the CPU (``--device cpu``) the same bench runs: targets in host memory, the bus limit
skipped with a line saying so. There tg (like ``load_file``) gives a meta model the file's own
memory-mapped tensors, so its "read limit", which copies every byte, is no bound. Figures on
the 2-core development machine (no GPU; shared, load 4.4 to 6.8), ``--device cpu --size-gib 1
--rounds 2 --cold-rounds 1``, 2026-11-28, medians of round ratios against ``load_file``:

=============================  ==========  ==========  ===========  ===========
method                         folder      folder      file         file
                               warm        cold        warm         cold
=============================  ==========  ==========  ===========  ===========
tg                             0.100 s     0.812 s     0.077 s      1.018 s
                               1.17x       0.71x       1.02x        0.23x
load_file                      0.086 s     1.147 s     0.076 s      4.520 s
runai-model-streamer 0.16.1    69x         7.7x        89x          1.8x
fastsafetensors 0.5.0          11x         1.4x        21x          0.28x
read limit (2 threads)         3.2x        3.3x        4.8x         0.90x
=============================  ==========  ==========  ===========  ===========

(``tg_pt`` 1.43x warm, ``torch_load`` 2.30x; cold reads on this shared virtual disk vary
several-fold between rounds.) End to end, meta build + ``tg.graft(..., device="cpu")`` took
0.55x ``from_pretrained(device_map="cpu")``'s time, logits equal. No GPU figure yet: the
device session runs ``scripts/gpu_check.sh``.

Run: python bench/gpu.py [--device cuda] [--size-gib 4] [--rounds 3] [--cold-rounds 2]
[--budget SECONDS]
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
from typing import Any  # noqa: E402

from harness import (  # noqa: E402
    evict,
    files_of,
    linears,
    peak_since_reset,
    reset_peak,
    resident,
    rss_now,
    warm,
    warm_graft,
)

GIB = 1 << 30
FOLDER_METHODS = ("tg", "load_file", "runai", "fastsafetensors", "read", "bus")
FILE_METHODS = ("tg", "tg_pt", "load_file", "torch_load", "runai", "fastsafetensors", "read",
                "bus")
END_TO_END = ("from_pretrained", "meta_graft")
ANCHORS = ("load_file", "torch_load", "runai", "fastsafetensors")
LIMITS = ("read", "bus")


def _llama_config(size_gib: float) -> Any:
    """A Llama of about ``size_gib`` GiB in bf16: 7B's widths, as many layers as fit."""
    from transformers import LlamaConfig

    hidden, inner = (4096, 11008) if size_gib >= 3 else (2048, 5632)
    vocab = 32000
    per_layer = (4 * hidden * hidden + 3 * hidden * inner + 2 * hidden) * 2
    layers = max(1, round((size_gib * GIB - 2 * vocab * hidden * 2) / per_layer))
    return LlamaConfig(hidden_size=hidden, intermediate_size=inner, num_hidden_layers=layers,
                       num_attention_heads=hidden // 128, num_key_value_heads=hidden // 128,
                       vocab_size=vocab, tie_word_embeddings=False)


def make(folder: Path, size_gib: float, device: str) -> None:
    """Write the folder (several shards) and the single file, as .safetensors and .pt."""
    import torch
    from safetensors.torch import save_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):  # random values drawn where it is fastest
        llama = LlamaForCausalLM(_llama_config(size_gib)).to(torch.bfloat16)
    llama.save_pretrained(folder / "llama", max_shard_size=f"{max(1, int(size_gib * 0.4))}GB")
    del llama
    torch.manual_seed(0)
    model = linears(int(size_gib * 256))
    save_model(model, str(folder / "linears.safetensors"))
    torch.save(model.state_dict(), folder / "linears.pt")


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _model(kind: str, path: Path) -> Any:
    """The target, built on the meta device."""
    if kind == "folder":
        return _llama_on_meta(path)
    size = path.with_suffix(".safetensors").stat().st_size
    return linears(round(size / (4 << 20)), "meta")


def _llama_on_meta(path: Path) -> Any:
    """The folder's model built on meta in bf16, as from_pretrained builds it (buffers such
    as the rotary frequencies computed in float32)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                                dtype=torch.bfloat16)


def _shards(path: Path) -> list[str]:
    return [str(f) for f in files_of(path) if f.suffix == ".safetensors"]


def _bus(size: int, device: str) -> dict[str, Any]:
    """Seconds to copy ``size`` bytes from pinned host memory to the device, nothing parsed."""
    import torch

    if not device.startswith("cuda"):
        return {"skipped": "the bus limit (pinned host -> device) needs CUDA"}
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    out = torch.empty(size, dtype=torch.uint8, device=device)
    out[:1024].copy_(host[:1024])  # the copy engine's first use, not timed
    torch.cuda.synchronize()
    start = time.perf_counter()
    out.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - start}


def _read(files: list[str], device: str) -> dict[str, Any]:
    """Seconds to read the files into host buffers with tg's threads and pieces, nothing parsed.

    Each thread takes the next piece of the next file and reads it with ``preadv`` into the
    next of its two buffers (pinned where the device is CUDA), as tg's readers do.
    """
    import threading

    import torch

    from torchgraft.io.reads import BUFFERS_PER_READER, PIECE_BYTES, READERS

    pieces = [(f, offset, min(PIECE_BYTES, os.path.getsize(f) - offset))
              for f in files for offset in range(0, os.path.getsize(f), PIECE_BYTES)]
    pinned = device.startswith("cuda")
    ring = torch.empty(READERS * BUFFERS_PER_READER * PIECE_BYTES, dtype=torch.uint8,
                       pin_memory=pinned)
    fds = {f: os.open(f, os.O_RDONLY) for f in files}
    tasks = iter(pieces)
    lock = threading.Lock()

    def reader(k: int) -> None:
        turn = 0
        while True:
            with lock:
                piece = next(tasks, None)
            if piece is None:
                return
            file, offset, size = piece
            first = (k * BUFFERS_PER_READER + turn) * PIECE_BYTES
            view = ring[first:first + size].numpy().data
            done = 0
            while done < size:
                done += os.preadv(fds[file], [view[done:]], offset + done)
            turn = (turn + 1) % BUFFERS_PER_READER

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(READERS)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    for fd in fds.values():
        os.close(fd)
    return {"seconds": seconds, "threads": READERS}


def _checksum(model: Any) -> float:
    import torch

    return float(sum(float(p.detach().sum(dtype=torch.float64)) for p in model.parameters()))


def _touched(model: Any) -> int:
    """Read one byte of every page of every weight: a memory-mapped weight is then in memory.

    On the CPU loaders that map the file return before reading it; this is the least that
    makes each page resident, and costs an in-memory weight almost nothing.
    """
    import torch

    return sum(int(p.detach().reshape(-1).view(torch.uint8)[::4096].sum())
               for p in model.parameters() if p.numel())


def load(method: str, kind: str, path: Path, device: str) -> dict[str, Any]:
    """One timed load in this fresh process."""
    import torch

    files = _shards(path) if kind == "folder" else [str(path)]
    if method == "bus":
        return _bus(sum(os.path.getsize(f) for f in files_of(path)), device)
    if method == "read":
        return _read(files, device)
    try:
        if method == "runai":
            from runai_model_streamer import SafetensorsStreamer
        elif method == "fastsafetensors":
            from fastsafetensors import SafeTensorsFileLoader
    except ImportError:
        return {"skipped": f"{method} is not installed here"}
    from safetensors.torch import load_file

    import torchgraft as tg

    model = _model(kind, path)
    if device.startswith("cuda"):
        torch.zeros(1, device=device)  # the CUDA context, not timed
    if method.startswith("tg"):
        warm_graft(path.parent)
    keep: list[Any] = []  # what must outlive the load: fastsafetensors' buffers
    hwm = reset_peak()
    before = rss_now()
    start = time.perf_counter()
    if method in ("tg", "tg_pt"):
        assert tg.graft(path, model, device=device, strict=True).ok
    elif method == "load_file":
        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(load_file(file, device=device))
        model.load_state_dict(state, assign=True)
    elif method == "torch_load":
        model.load_state_dict(torch.load(path, map_location=device, mmap=True,
                                         weights_only=True), assign=True)
    elif method == "runai":
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(files)
            state = {name: tensor.to(device, copy=True)
                     for name, tensor in streamer.get_tensors()}
        model.load_state_dict(state, assign=True)
    else:
        where = f"{device}:0" if device == "cuda" else device  # its own device parser
        loader = SafeTensorsFileLoader(None, where, nogds=True)
        loader.add_filenames({0: files})
        buffers = loader.copy_files_to_device()
        model.load_state_dict({k: buffers.get_tensor(k) for k in loader.get_keys()},
                              assign=True)
        keep += [buffers, loader]
    _sync(device)
    if not device.startswith("cuda"):  # a memory-mapped weight is read only when used
        _touched(model)
    seconds = time.perf_counter() - start
    peak = (peak_since_reset() if hwm else 0) - before
    return {"seconds": seconds, "peak": peak, "checksum": _checksum(model)}


def end_to_end(method: str, path: Path, device: str, out: Path) -> dict[str, Any]:
    """from_pretrained against a meta build plus tg.graft: the whole, the load apart."""
    import torch
    from transformers import LlamaForCausalLM

    import torchgraft as tg

    if device.startswith("cuda"):
        torch.zeros(1, device=device)
    if method == "meta_graft":
        warm_graft(path.parent)
    hwm = reset_peak()
    before = rss_now()
    start = time.perf_counter()
    if method == "from_pretrained":
        model = LlamaForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map=device)
        loaded = start
    else:
        model = _llama_on_meta(path)
        loaded = time.perf_counter()
        assert tg.graft(path, model, device=device, strict=True).ok
    _sync(device)
    if not device.startswith("cuda"):
        _touched(model)  # every page in memory, as in load()
    end = time.perf_counter()
    peak = (peak_since_reset() if hwm else 0) - before
    tokens = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model.eval()(tokens.to(device)).logits.float().cpu()
    torch.save(logits, out)
    return {"seconds": end - start, "load": end - loaded, "peak": peak}


def profile_from_pretrained(path: Path, device: str) -> list[tuple[str, float]]:
    """Where from_pretrained spends its time: the cumulative seconds of its loading steps."""
    import cProfile
    import pstats

    import torch
    from transformers import LlamaForCausalLM

    if device.startswith("cuda"):
        torch.zeros(1, device=device)
    profiler = cProfile.Profile()
    profiler.enable()
    LlamaForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map=device)
    _sync(device)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = [(f"{Path(file).stem}.{name}", cumulative)
            for (file, _line, name), (_cc, _nc, _tt, cumulative, _callers) in stats.items()
            if ("transformers" in file or "safetensors" in file)
            and name not in ("from_pretrained", "wrapper", "_wrapper", "<module>")]
    return sorted(rows, key=lambda row: -row[1])[:8]


def _worker(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--worker", *args], check=False,
                         capture_output=True, text=True)
    if out.returncode:
        return {"failed": out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]}
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _median_ratio(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> float | None:
    pairs = [a["seconds"] / b["seconds"] for a, b in zip(ours, theirs, strict=False)
             if "seconds" in a and "seconds" in b]
    return statistics.median(pairs) if pairs else None


def _fastest(runs: dict[str, list[dict[str, Any]]], names: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per round, the fastest of the given methods that ran."""
    rounds = max((len(runs.get(n, [])) for n in names), default=0)
    best: list[dict[str, Any]] = []
    for r in range(rounds):
        times = [runs[n][r]["seconds"] for n in names if n in runs and len(runs[n]) > r
                 and "seconds" in runs[n][r]]
        best.append({"seconds": min(times)} if times else {})
    return best


def _table(title: str, runs: dict[str, list[dict[str, Any]]], size: int) -> None:
    print(f"\n{title}")
    print("| method | time s (median) | GB/s | vs load_file (median of round ratios) | "
          "host peak GiB (max) |")
    print("|---|---|---|---|---|")
    for method, results in runs.items():
        done = [r for r in results if "seconds" in r]
        if not done:
            why = next((r.get("skipped") or r.get("failed") for r in results), "not run")
            print(f"| {method} | skipped: {why} | | | |")
            continue
        seconds = statistics.median(r["seconds"] for r in done)
        ratio = _median_ratio(results, runs["load_file"])
        peak = max((r.get("peak", 0) for r in done), default=0) / GIB
        print(f"| {method} | {seconds:.3f} | {size / seconds / 1e9:.1f} | "
              f"{'' if ratio is None else f'{ratio:.2f}x'} | "
              f"{peak:.2f} |")


def _verdicts(kind: str, cache: str, runs: dict[str, list[dict[str, Any]]], size: int,
              on_device: bool) -> None:
    tg = runs["tg"]
    anchors = _fastest(runs, ANCHORS)
    to_read = _median_ratio(tg, runs["read"])
    to_bus = _median_ratio(tg, runs["bus"]) if "bus" in runs else None
    peak = max((r.get("peak", 0) for r in tg if "peak" in r), default=0) / size
    line = [f"{kind}, {cache}: tg {_fmt(_median_ratio(tg, anchors))} the fastest anchor",
            f"{_fmt(to_read)} the read limit", f"{_fmt(to_bus)} the bus limit",
            f"host peak {peak:.2f}x the checkpoint " + (
                f"(<= 0.25: {'met' if peak <= 0.25 else 'NOT met'})" if on_device
                else "(the weights live in host memory)")]
    if kind == "folder" and cache == "warm":
        to_runai = _median_ratio(tg, runs["runai"])
        read_vs_runai = _median_ratio(runs["read"], runs["runai"])
        if to_runai is not None:
            bound = 0.5 if read_vs_runai is None or read_vs_runai <= 0.5 else None
            met = (to_runai <= 0.5) if bound else (to_read is not None and to_read <= 1.2)
            line.append(f"vs runai {to_runai:.2f}x (<= 0.5, or <= 1.2x the read limit where "
                        f"that is above 0.5x runai: {'met' if met else 'NOT met'})")
    if cache == "cold":
        ratio = _median_ratio(tg, anchors)
        if ratio is not None:
            line.append(f"cold vs the fastest anchor <= 1: {'met' if ratio <= 1 else 'NOT met'}")
    print("; ".join(line))


def _fmt(ratio: float | None) -> str:
    return "n/a x" if ratio is None else f"{ratio:.2f}x"


def main() -> None:
    """Write the inputs, run every method in rounds, print the tables and the verdicts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda (default where present) or cpu")
    parser.add_argument("--size-gib", type=float, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cold-rounds", type=int, default=2)
    parser.add_argument("--budget", type=float, default=0,
                        help="seconds after which no new round starts (0: no limit)")
    parser.add_argument("--dir", default=None, help="where to write the inputs (a disk)")
    parser.add_argument("--worker", nargs="+")
    args = parser.parse_args()
    if args.worker:
        job, *rest = args.worker
        if job == "make":
            make(Path(rest[0]), float(rest[1]), rest[2])
            print("{}")
        elif job == "end_to_end":
            print(json.dumps(end_to_end(rest[0], Path(rest[1]), rest[2], Path(rest[3]))))
        elif job == "profile":
            print(json.dumps(profile_from_pretrained(Path(rest[0]), rest[1])))
        else:
            print(json.dumps(load(job, rest[0], Path(rest[1]), rest[2])))
        return
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    size_gib = args.size_gib or (4.0 if device.startswith("cuda") else 1.0)
    begun = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        made = _worker("make", tmp, str(size_gib), device)
        assert "failed" not in made, made
        inputs = {"folder": folder / "llama", "file": folder / "linears.safetensors"}
        sizes = {"folder": sum(f.stat().st_size for f in files_of(inputs["folder"])
                               if f.suffix == ".safetensors"),
                 "file": inputs["file"].stat().st_size}
        shards = len(_shards(inputs["folder"]))
        card = torch.cuda.get_device_name() if device.startswith("cuda") else "no GPU"
        print(f"device {device} ({card}), {os.cpu_count()} CPUs, load {os.getloadavg()}; "
              f"folder {sizes['folder'] / GIB:.2f} GiB in {shards} shards, file "
              f"{sizes['file'] / GIB:.2f} GiB; inputs written in "
              f"{time.perf_counter() - begun:.0f} s")
        runs: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {
            (kind, cache): {m: [] for m in (FOLDER_METHODS if kind == "folder" else FILE_METHODS)
                            if cache == "warm" or m != "bus"}  # the bus reads no file
            for kind in inputs for cache in ("warm", "cold")}
        whole: dict[str, list[dict[str, Any]]] = {m: [] for m in END_TO_END}
        residency: list[float] = []
        spent = False
        for r in range(args.rounds):
            # the round's essentials first: warm folder, end to end, warm file, then cold
            jobs = [("warm", "folder", m) for m in runs[("folder", "warm")]]
            jobs += [("e2e", "folder", m) for m in END_TO_END]
            jobs += [("warm", "file", m) for m in runs[("file", "warm")]]
            if r < args.cold_rounds:
                jobs += [("cold", kind, m) for kind in inputs for m in runs[(kind, "cold")]]
            for cache, kind, method in jobs:
                if args.budget and time.perf_counter() - begun > args.budget:
                    spent = True
                    break
                path = inputs[kind]
                target = path.with_suffix(".pt") if method in ("tg_pt", "torch_load") else path
                if cache == "cold":
                    evict(target)
                    residency.append(resident(target))
                else:
                    warm(target)
                if cache == "e2e":
                    result = _worker("end_to_end", method, str(path), device,
                                     str(folder / f"{method}.logits"))
                    whole[method].append(result)
                else:
                    result = _worker(method, kind, str(target), device)
                    runs[(kind, cache)][method].append(result)
                print(f"round {r + 1}: {kind} {cache} {method}: "
                      f"{json.dumps({k: v for k, v in result.items() if k != 'checksum'})}",
                      flush=True)
            if spent:
                print(f"budget of {args.budget:.0f} s spent in round {r + 1} of {args.rounds}")
                break
        profile = _worker("profile", str(inputs["folder"]), device) if not spent else None
        equal = all((folder / f"{m}.logits").exists() for m in END_TO_END) and torch.equal(
            *(torch.load(folder / f"{m}.logits") for m in END_TO_END))
    print(f"cold runs: at most {max(residency, default=0):.0%} of the files' pages resident "
          "after eviction")
    for (kind, cache), results in runs.items():
        sums = {m: {round(r["checksum"], 1) for r in rs if "checksum" in r}
                for m, rs in results.items()}
        if len(set().union(*sums.values())) > 1:
            print(f"\n{kind}, {cache}: THE METHODS GAVE DIFFERENT WEIGHTS: {sums}")
        _table(f"{kind} ({sizes[kind] / GIB:.2f} GiB), {cache} cache", results, sizes[kind])
        _verdicts(kind, cache, results, sizes[kind], device.startswith("cuda"))
    print("\nend to end (folder, warm): meta build + tg.graft against from_pretrained")
    for method, results in whole.items():
        done = [r for r in results if "seconds" in r]
        if done:
            print(f"{method}: {statistics.median(r['seconds'] for r in done):.3f} s in all, "
                  f"the load {statistics.median(r['load'] for r in done):.3f} s, host peak "
                  f"{max(r['peak'] for r in done) / GIB:.2f} GiB")
        else:
            print(f"{method}: failed {results[:1]}")
    ratio = _median_ratio(whole["meta_graft"], whole["from_pretrained"])
    print(f"meta build + tg.graft {_fmt(ratio)} from_pretrained's time (<= 1: "
          f"{'met' if ratio is not None and ratio <= 1 else 'NOT met'}); logits "
          f"{'equal' if equal else 'DIFFER'}")
    if isinstance(profile, list):
        print("from_pretrained's loading steps (cumulative s, one profiled run): " + ", ".join(
            f"{name} {seconds:.2f}" for name, seconds in profile))
    print(f"bench took {time.perf_counter() - begun:.0f} s")


if __name__ == "__main__":
    main()
