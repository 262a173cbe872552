"""Coverage-guided fuzzing of every registered reader with atheris (libFuzzer).

Each format's seed (a real file, from tests/io/test_conformance.py's SEEDS) is the corpus;
with ``--format all-in-one`` its other structure files (the battery's STRUCTURE) are targets
too. libFuzzer mutates a structure file guided by the coverage of torchgraft's own code, and
every input is opened and read in full (``meta()`` against ``get()``). An input must load
or raise a library error: anything else is counted as a raw exception and its input kept.

    python scripts/fuzz_readers.py --runs 10000 --out fuzz-report     # every format, long
    python scripts/fuzz_readers.py --runs 300 --format safetensors/.safetensors
    python scripts/fuzz_readers.py --runs 400 --format all-in-one   # CI: one process

Every format runs in its own process, under ``RLIMIT_AS`` (what the process has after its
imports, plus ``--memory-mib``) and ``RLIMIT_CPU`` (``--cpu-seconds``), with libFuzzer's
per-input ``-timeout``. The report (``OUT/report.json``, and a table on stdout) gives per
format: inputs run, raw exceptions, inputs that ran out of time or memory, and the peak
resident memory. Needs ``pip install atheris``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: ``--format all-in-one``: every format in one process, an input's first byte picking it.
ALL = "all-in-one"


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _worker(name: str, runs: int, out: Path, memory_mib: int, timeout: int) -> None:
    """Fuzz one format in this process (libFuzzer takes the process: it never returns)."""
    import atheris

    sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
    with atheris.instrument_imports(include=["torchgraft"]):
        import torchgraft  # noqa: F401  (instrumented for coverage)
    import warnings

    from tests.io import test_conformance as battery

    warnings.simplefilter("ignore")
    work = out / f"work-{name.replace('/', '_')}"
    shutil.rmtree(work, ignore_errors=True)
    corpus = work / "corpus"
    corpus.mkdir(parents=True)
    names = sorted(battery.SEEDS) if name == ALL else [name]
    # Each format's seed target, then its other structure files (the battery's STRUCTURE:
    # a DCP data file, a DeepSpeed rank file, an MLX or Orbax folder's metadata...), each in
    # a copy of its own.
    targets = [(each, None) for each in names] + [
        (each, part) for each in names for part in battery.STRUCTURE.get(each, ())]
    seeds = []
    for number, (each, part) in enumerate(targets):
        (work / str(number)).mkdir()
        opened, target = battery.SEEDS[each](work / str(number))
        if part is not None:
            target = (opened if opened.is_dir() else opened.parent) / part
        seeds.append((opened, target))
        # With several targets, an input's first byte picks the target.
        prefix = bytes([number]) if name == ALL else b""
        (corpus / str(number)).write_bytes(prefix + target.read_bytes())
    stats: dict[str, Any] = {"format": name, "inputs": 0, "raw": 0, "examples": []}
    report = out / f"{name.replace('/', '_')}.json"
    crashes = out / f"{name.replace('/', '_')}-inputs"

    def save_stats() -> None:
        stats["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        report.write_text(json.dumps(stats, indent=1))

    def one_input(data: bytes) -> None:
        if name == ALL:
            if not data:
                stats["inputs"] += 1
                return
            opened, target = seeds[data[0] % len(seeds)]
            data = data[1:]
        else:
            opened, target = seeds[0]
        target.write_bytes(data)
        problem = battery.read_fully(opened)
        stats["inputs"] += 1
        if problem is not None:
            stats["raw"] += 1
            if len(stats["examples"]) < 20:
                stats["examples"].append(problem[:300])
                crashes.mkdir(exist_ok=True)
                (crashes / f"{stats['raw']}.bin").write_bytes(data)
        save_stats()  # libFuzzer ends the process without returning

    save_stats()
    resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + memory_mib * 2**20,
                                            resource.RLIM_INFINITY))
    max_len = max(4096, 2 * max(len(target.read_bytes()) for _, target in seeds))
    atheris.Setup([sys.argv[0], f"-runs={runs}", f"-timeout={timeout}", "-rss_limit_mb=0",
                   f"-max_len={max_len}", "-print_final_stats=1", str(corpus)], one_input)
    atheris.Fuzz()


def _run(name: str, args: argparse.Namespace) -> dict[str, object]:
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (args.cpu_seconds, args.cpu_seconds + 5))

    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, __file__, "--worker", name, "--runs", str(args.runs), "--out",
         str(args.out), "--memory-mib", str(args.memory_mib), "--timeout", str(args.timeout)],
        preexec_fn=limits, capture_output=True, text=True, check=False)
    report = args.out / f"{name.replace('/', '_')}.json"
    stats: dict[str, object] = json.loads(report.read_text()) if report.exists() else {
        "format": name, "inputs": 0, "raw": 0, "examples": []}
    shutil.rmtree(args.out / f"work-{name.replace('/', '_')}", ignore_errors=True)
    stats["exit"] = done.returncode
    stats["seconds"] = round(time.monotonic() - start, 1)
    # libFuzzer's own verdicts: a slow input (-timeout), a crash, or the limits above.
    stats["libfuzzer"] = [line for line in done.stderr.splitlines()
                          if "ERROR: libFuzzer" in line or "==ERROR" in line][:5]
    stats["libfuzzer_runs"] = next((int(line.split()[1]) for line in done.stderr.splitlines()
                                    if line.startswith("Done ") and " runs in " in line), None)
    return stats


def main() -> int:
    """Fuzz the formats asked for; print a table; exit 1 if any input escaped."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", action="append", help="A key of the battery's SEEDS, or "
                        f"'{ALL}' (default: every registered format, one process each)")
    parser.add_argument("--runs", type=int, default=10_000, help="Inputs per format.")
    parser.add_argument("--out", type=Path, default=Path("fuzz-report"))
    parser.add_argument("--memory-mib", type=int, default=2048)
    parser.add_argument("--cpu-seconds", type=int, default=3600)
    parser.add_argument("--timeout", type=int, default=10, help="Seconds per input.")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        _worker(args.worker, args.runs, args.out, args.memory_mib, args.timeout)
        return 0
    sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
    from tests.io.test_conformance import SEEDS

    names = args.format or sorted(SEEDS)
    results = [_run(name, args) for name in names]
    (args.out / "report.json").write_text(json.dumps(results, indent=1))
    print(f"{'format':28} {'inputs':>7} {'raw':>4} {'exit':>4} {'peak MiB':>8} {'s':>6}")
    for r in results:
        print(f"{r['format']!s:28} {r['inputs']!s:>7} {r['raw']!s:>4} {r['exit']!s:>4} "
              f"{r.get('peak_rss_mib', '?')!s:>8} {r['seconds']!s:>6}")
        for line in [*r["libfuzzer"], *r["examples"]][:3]:  # type: ignore[misc]
            print(f"    {line}")
    bad = [r for r in results if r["raw"] or r["libfuzzer"] or r["inputs"] < args.runs]
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
