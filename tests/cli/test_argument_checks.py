"""A bad argument exits 2 with one line on stderr, before torch is imported, in under a second.

Each case runs the entry point in a fresh interpreter that reports whether torch was imported
and how long the command took; each has a twin that shows the same option working.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

#: Runs the command line, then prints whether torch was imported and how many modules were.
PROBE = """
import sys
before = len(sys.modules)
from torchgraft.cli.main import main
code = main(sys.argv[1:])
print(f"probe torch={'torch' in sys.modules} modules={len(sys.modules) - before}")
sys.exit(code)
"""
#: The most modules the command line may import to refuse a bad argument (torch alone is
#: over 1,000): it refuses at once, counted rather than timed.
AT_ONCE = 400

MODEL = "import torch\n\ndef net():\n    return torch.nn.Linear(2, 2)\n"


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    save_file(torch.nn.Linear(2, 2).state_dict(), tmp_path / "w.safetensors")
    (tmp_path / "mymodels.py").write_text(MODEL)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("taken")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    return tmp_path


def _probe(*args: str) -> tuple[int, str, str]:
    result = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True,
                            text=True, timeout=120)
    return result.returncode, result.stdout, result.stderr


GRAFT = ["graft", "w.safetensors", "--model", "mymodels.py:net"]

#: Arguments, and what the one line must say.
BAD = {
    "a dtype torch does not have": (["convert", "w.safetensors", "o.safetensors", "--dtype",
                                     "bfloat"], "'bfloat' is not one of"),
    "a missing checkpoint": (["convert", "nope.pth", "o.pt"],
                             "nope.pth: no such file or directory"),
    "a DST without a suffix": (["convert", "w.safetensors", "out"], "--format dcp"),
    "a suffix no format writes": (["convert", "w.safetensors", "o.xyz"],
                                  "no format is written as '.xyz'"),
    "Paddle from convert": (["convert", "w.safetensors", "o.pdparams"], "graft SRC --model"),
    "a format convert does not write": (["convert", "w.safetensors", "o.pt", "--format",
                                         "paddle"], "'paddle' is not one of"),
    "--legacy for safetensors": (["convert", "w.safetensors", "o.safetensors", "--legacy"],
                                 "--legacy writes torch files"),
    "--ranks for safetensors": (["convert", "w.safetensors", "o.safetensors", "--ranks", "2"],
                                "--ranks lays out a DCP folder"),
    "--max-shard-size for numpy": (["convert", "w.safetensors", "o.npz", "--max-shard-size",
                                    "1GB"], "--max-shard-size shards safetensors"),
    "a size that is no size": (["convert", "w.safetensors", "o.safetensors",
                                "--max-shard-size", "1.2.3"], "not a size such as 2GB"),
    "an existing DST": (["convert", "w.safetensors", "w.safetensors"],
                        "exists; pass --overwrite"),
    "inspect of a missing file": (["inspect", "nope.pth"], "nope.pth: no such file"),
    "diff with a missing file": (["diff", "w.safetensors", "nope.pt"], "nope.pt: no such file"),
    "an unknown --match": ([*GRAFT, "--match", "fuzzy"], "'fuzzy' is not one of"),
    "an unknown --init": ([*GRAFT, "--init", "random"], "'random' is not one of"),
    "a --model without a factory": (["graft", "w.safetensors", "--model", "mymodels"],
                                    "expected MODULE:FACTORY"),
    "a --model file that is not there": (["graft", "w.safetensors", "--model", "gone.py:net"],
                                         "gone.py: model file not found"),
    "--model-kwargs not an object": ([*GRAFT, "--model-kwargs", "[1]"], "a JSON object"),
    "--label-map of booleans": ([*GRAFT, "--label-map", "[true]"], "list of checkpoint rows"),
    "a missing --rules file": ([*GRAFT, "--rules", "nope.yaml"], "--rules nope.yaml: no such"),
    "a missing --inputs file": ([*GRAFT, "--inputs", "in.safetensors"], "--inputs in."),
    "--out /dev/null": ([*GRAFT, "--out", "/dev/null"], "leave --out out"),
    "an existing --out": ([*GRAFT, "--out", "w.safetensors"], "or --dry-run to save nothing"),
    "an --out without a suffix": ([*GRAFT, "--out", "grafted"], "--format dcp"),
    "--format without --out": ([*GRAFT, "--format", "dcp"], "give --out"),
    "export to a checkpoint": (["export", "mymodels.py:net", "--out", "x.pt", "--input-shape",
                                "1,2"], "does not end with .onnx"),
    "a shape that is no shape": (["export", "mymodels.py:net", "--out", "x.onnx",
                                  "--input-shape", "1,x"], "not a shape such as"),
    "an input of a trillion values": (["export", "mymodels.py:net", "--out", "x.onnx",
                                       "--input-shape", "100000,100000,100"], "batch 1"),
    "an opset not exported": (["export", "mymodels.py:net", "--out", "x.onnx",
                               "--input-shape", "1,2", "--opset", "30"], "9<=x<=20"),
    "demo into a folder with files": (["demo", "--keep", "full"], "already holds files"),
    "demo onto a file": (["demo", "--keep", "w.safetensors"], "is a file"),
    "demo under a file": (["demo", "--keep", "w.safetensors/sub"],
                          "cannot make the folder 'w.safetensors/sub' (Not a directory)"),
    "demo onto a link to nothing": (["demo", "--keep", "gone"], "'gone' is a link to nothing"),
    "an unknown option": (["convert", "w.safetensors", "o.pt", "--fromat", "torch"],
                          "Did you mean '--format'"),
    "an unknown command": (["convrt"], "No such command"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_argument_exits_2_at_once_without_torch(folder: Path, case: str) -> None:
    args, message = BAD[case]
    code, out, err = _probe(*args)
    assert code == 2, err
    assert err.startswith("torchgraft: error: ") and len(err.strip().splitlines()) == 1, err
    assert message in err and "Traceback" not in err
    assert "probe torch=False" in out  # checked before torch was imported
    modules = int(out.split("modules=")[1])
    assert modules < AT_ONCE, modules


@pytest.mark.slow
def test_the_same_options_given_well_work(folder: Path,
                                          run: Callable[..., subprocess.CompletedProcess[str]]
                                          ) -> None:
    cases = [
        ["convert", "w.safetensors", "o.safetensors", "--dtype", "BF16"],
        ["convert", "w.safetensors", "ckpt", "--format", "dcp"],
        ["convert", "w.safetensors", "o.pt", "--legacy", "--max-shard-size", "1GB"],
        [*GRAFT, "--match", "name", "--init", "zeros", "--label-map", "[0, null]",
         "--out", "g.safetensors", "--model-kwargs", "{}"],
        [*GRAFT, "--out", "grafted", "--format", "dcp"],
        ["diff", "w.safetensors", "o.safetensors"],
    ]
    for args in cases:
        result = run(*args)
        assert result.returncode in (0, 1), (args, result.stderr)  # diff: bf16 differs
        assert "Traceback" not in result.stderr
    assert load_file(folder / "o.safetensors")["weight"].dtype == torch.bfloat16
    assert (folder / "ckpt" / ".metadata").is_file() and (folder / "grafted").is_dir()
    assert torch.equal(torch.load(folder / "o.pt", weights_only=True)["bias"],
                       load_file(folder / "w.safetensors")["bias"])


@pytest.mark.slow
def test_the_convert_of_a_dst_without_a_suffix_says_how_to_write_a_dcp_folder(
        folder: Path) -> None:
    """The library writes DCP for a name without a suffix; the command line asks first."""
    code, _out, err = _probe("convert", "w.safetensors", "out")
    assert code == 2 and not (folder / "out").exists()
    assert "'out' has no suffix" in err and "--format dcp" in err
    code, _out, err = _probe("convert", "w.safetensors", "out", "--ranks", "2")  # DCP only
    assert code == 0, err
    assert (folder / "out" / ".metadata").is_file()


@pytest.mark.slow
def test_an_unknown_file_lists_the_formats_read_by_their_names_once_each(
        folder: Path, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    (folder / "data.weird").write_bytes(bytes(range(256)) * 4)
    result = run("inspect", "data.weird")
    assert result.returncode == 2
    formats = result.stderr.split("it reads ")[1].strip().split(", ")
    assert len(formats) == len(set(formats)) > 10, formats
    assert "torch.save" in formats and "safetensors" in formats
    assert not {"torch-zip", "torch-legacy", "components"} & set(formats)
    known = run("inspect", "w.safetensors", "--json")  # its twin: a format it reads
    assert known.returncode == 0 and json.loads(known.stdout)["format"] == "safetensors"
