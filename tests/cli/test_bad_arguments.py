"""Bad input on the command line: one line naming the problem, exit 2, never a traceback."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from torchgraft.cli.main import main

MODEL = "import torch\n\ndef net():\n    return torch.nn.Linear(2, 2)\n"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "good.py").write_text(MODEL)
    (tmp_path / "broken.py").write_text("def net(:\n    pass\n")
    torch.manual_seed(0)
    save_file(torch.nn.Linear(2, 2).state_dict(), tmp_path / "w.safetensors")
    (tmp_path / "utf16.json").write_text('[["^x", "y"]]', encoding="utf-16")
    (tmp_path / "deep.json").write_text("[" * 5000 + "]" * 5000)
    (tmp_path / "backref.json").write_text(json.dumps([["^weight$", "\\9"]]))
    return {p.stem: p for p in tmp_path.iterdir()}


def _graft(files: dict[str, Path], *extra: str) -> list[str]:
    return ["graft", str(files["w"]), "--model", f"{files['good']}:net", "--out",
            str(files["w"].with_name("out.safetensors")), *extra]


CASES = {
    "model file with a syntax error": lambda f: ["graft", str(f["w"]), "--model",
                                                 f"{f['broken']}:net", "--out",
                                                 str(f["w"].with_name("o.safetensors"))],
    "unknown --model-kwargs key": lambda f: _graft(f, "--model-kwargs", '{"nope": 1}'),
    "non-ASCII --label-map key": lambda f: _graft(f, "--label-map", '{"\u00b2": 0}'),
    "UTF-16 rules file": lambda f: _graft(f, "--rules", str(f["utf16"])),
    "rules nested 5,000 deep": lambda f: _graft(f, "--rules", str(f["deep"])),
    "a \\9 back-reference in a rule": lambda f: _graft(f, "--rules", str(f["backref"])),
    "--max-shard-size 1.2.3": lambda f: ["convert", str(f["w"]),
                                         str(f["w"].with_name("c.safetensors")),
                                         "--max-shard-size", "1.2.3"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_arguments_are_a_message_and_exit_2(files: dict[str, Path], case: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = main(CASES[case](files))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.strip(), err


def test_the_good_arguments_work(files: dict[str, Path],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_graft(files, "--model-kwargs", "{}", "--label-map", '{"1": 0}')) == 0
    assert main(["convert", str(files["w"]), str(files["w"].with_name("c.safetensors")),
                 "--max-shard-size", "1.5KB"]) == 0


def test_an_npy_with_a_negative_dimension_is_refused_at_open(tmp_path: Path) -> None:
    path = tmp_path / "neg.npy"
    np.save(path, np.zeros((2, 3), dtype=np.float32))
    data = path.read_bytes()
    path.write_bytes(data.replace(b"(2, 3)", b"(2,-3)"))
    with pytest.raises(tg.CorruptCheckpointError, match="malformed shape"):
        tg.open(path)
    assert main(["inspect", str(path)]) == 2


def test_a_zero_point_outside_the_dtype_is_refused_before_graft(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch._empty_affine_quantized([4], scale=0.1, zero_point=-(2**40), dtype=torch.qint8)
        torch.save({"weight": q}, tmp_path / "q.pt")
    with pytest.raises(tg.CorruptCheckpointError, match="zero point"):
        tg.graft(tmp_path / "q.pt", torch.nn.Linear(2, 2))
