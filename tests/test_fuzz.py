"""Deterministic fuzzing: mutated checkpoints of every format, through open, load, graft, convert.

Each mutant (byte flips, truncations, inserted and deleted runs, 4- and 8-byte fields set huge,
zero or negative) is read in a worker process whose address space is capped (RLIMIT_AS) and
whose every mutant has a time limit. It must either load, or raise a ``TorchgraftError``; any
other exception, a hang or a crash fails the test. A torch zip file's metadata is covered by
the zip's CRC, so what loads from one holds the original names and shapes; formats with no
checksum over their headers (pickles, safetensors' JSON) can load a flipped name or a shape
with the same byte count, which no reader can tell from the real thing ("changed"). Counts
per format are printed for the record (``pytest -s``).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import random
import resource
import shutil
import signal
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

MUTANTS = int(os.environ.get("TORCHGRAFT_FUZZ_MUTANTS", "300"))
SECONDS = 10
MEMORY = 1 << 30  # beyond what the worker has once torch is imported


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean((2, 3)))


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {k: v.detach().clone() for k, v in _Net().state_dict().items()}


def _seeds(folder: Path) -> dict[str, Path]:
    state = _state()
    paths = {
        "torch-zip": folder / "m.pt",
        "torch-legacy": folder / "legacy.pth",
        "safetensors": folder / "m.safetensors",
        "numpy": folder / "m.npz",
        "paddle": folder / "m.pdparams",
    }
    torch.save({"state_dict": state, "epoch": 3}, paths["torch-zip"])
    torch.save(state, paths["torch-legacy"], _use_new_zipfile_serialization=False)
    save_file(state, paths["safetensors"], metadata={"format": "pt"})
    np.savez(paths["numpy"], **{k: v.numpy() for k, v in state.items()})
    import pickle

    with paths["paddle"].open("wb") as f:
        pickle.dump({k: v.numpy() for k, v in state.items()}, f, protocol=2)
    from torch.distributed.checkpoint import save

    paths["dcp"] = folder / "dcp"
    save(state, checkpoint_id=str(paths["dcp"]))
    import torchgraft as tg

    torch.manual_seed(0)
    paths["torch-export"] = folder / "m.pt2"
    torch.export.save(torch.export.export(_Net(), (torch.randn(1, 3, 5, 5),)),
                      paths["torch-export"])
    paths["sharded"] = folder / "sharded"
    tg.save(state, paths["sharded"] / "model.safetensors", max_shard_size=200)
    return paths


def _mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    kind = rng.randrange(6)
    at = rng.randrange(len(out))
    if kind == 0:
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del out[at:]
    elif kind == 2:
        out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif kind == 3:
        del out[at:at + rng.randint(1, 64)]
    else:
        width = rng.choice((4, 8))
        value = rng.choice((b"\xff", b"\x7f", b"\x00", b"\x80"))
        out[at:at + width] = value * width
    return bytes(out)


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY + _vm_size(), resource.RLIM_INFINITY))
    warnings.simplefilter("ignore")


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _timeout(_signum: int, _frame: Any) -> None:
    raise TimeoutError("the mutant took too long")


def _cli(path: Path) -> str | None:
    """``torchgraft inspect --json`` on a mutant: exit 0 or 2 with one line, or what went wrong."""
    from torchgraft.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["inspect", str(path), "--json"])
    if code == 0:
        return None
    if code == 2 and len(err.getvalue().strip().splitlines()) == 1:
        return None
    return f"other: CLI exit {code}: {err.getvalue()[:200]}"


def _read(path_text: str, expected: dict[str, tuple[int, ...]]) -> str:
    """Open, load, graft and convert one mutant, and inspect it with the CLI; say how it went."""
    import torchgraft as tg

    path = Path(path_text)
    out = path.parent / f"{path.name}.out.safetensors"
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(SECONDS)
    try:
        cli_problem = _cli(path)
        if cli_problem:
            return cli_problem
        with tg.open(path) as ckpt:
            names = {k: ckpt.meta(k).shape for k in ckpt.keys()}
        loaded = tg.load(path)
        report = tg.graft(path, _Net(), verify=False)
        tg.convert(path, out, overwrite=True)
        if names != expected or {k: tuple(v.shape) for k, v in loaded.items()} != expected:
            return "changed: loaded with other names or shapes"
        return "loaded" if report.ok else "loaded (graft incomplete)"
    except tg.TorchgraftError as exc:
        named = None if exc.path is None else Path(exc.path)
        if named is None or named == out or not (named == path or path in named.parents):
            return f"other: the error names no file of the mutant: {str(exc)[:200]}"
        return "clean error"
    except TimeoutError:
        return "other: hang"
    except BaseException as exc:  # what the test exists to catch
        return f"other: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.alarm(0)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mutants_load_or_fail_cleanly(tmp_path: Path) -> None:
    expected = {k: tuple(v.shape) for k, v in _state().items()}
    seeds = _seeds(tmp_path)
    rng = random.Random(20261122)
    jobs: list[tuple[str, Path]] = []
    for fmt, seed in seeds.items():
        for n in range(MUTANTS):
            mutant = tmp_path / f"{fmt}-{n}{''.join(seed.suffixes)}"
            if seed.is_dir():  # a folder checkpoint: one of its files mutated
                shutil.copytree(seed, mutant)
                victim = rng.choice(sorted(p for p in mutant.iterdir() if p.is_file()))
                victim.write_bytes(_mutate(victim.read_bytes(), rng))
            else:
                mutant.write_bytes(_mutate(seed.read_bytes(), rng))
            jobs.append((fmt, mutant))
    context = multiprocessing.get_context("fork")
    outcomes: dict[str, Counter[str]] = {fmt: Counter() for fmt in seeds}
    failures: list[str] = []
    with context.Pool(2, initializer=_limit) as pool:
        pending = [(fmt, path, pool.apply_async(_read, (str(path), expected)))
                   for fmt, path in jobs]
        for fmt, path, result in pending:
            try:
                outcome = result.get(timeout=SECONDS * 3)
            except multiprocessing.TimeoutError:
                outcome = "other: worker hung or crashed"
            outcomes[fmt][outcome.split(":")[0]] += 1
            if outcome.startswith("other") or (fmt == "torch-zip" and outcome != "loaded"
                                               and outcome != "clean error"):
                failures.append(f"{path.name}: {outcome}")
    for fmt, counts in outcomes.items():
        print(f"{fmt}: {sum(counts.values())} mutants, " + ", ".join(
            f"{n} {what}" for what, n in sorted(counts.items())))
    assert not failures, "\n".join(failures[:20])


def test_a_raw_exception_would_be_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torchgraft as tg

    path = _seeds(tmp_path)["safetensors"]
    expected = {k: tuple(v.shape) for k, v in _state().items()}
    assert _read(str(path), expected) == "loaded"

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a raw exception escaped")

    monkeypatch.setattr(tg, "load", broken)
    assert _read(str(path), expected).startswith("other: ValueError")

    def named_a_descriptor(*args: Any, **kwargs: Any) -> Any:
        raise tg.CorruptCheckpointError("the file shrank while open", path="/proc/self/fd/6")

    monkeypatch.setattr(tg, "load", named_a_descriptor)
    assert _read(str(path), expected).startswith("other: the error names no file")
