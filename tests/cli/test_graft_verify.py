"""``torchgraft graft --verify``: outputs compared with the source's own model, through the
entry point, with exit codes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

pytest.importorskip("transformers")

from tests.graft.pairs.codebases import hf_llama
from tests.graft.pairs.values import randomise

Run = Callable[..., subprocess.CompletedProcess[str]]

MODELS = '''
from tests.graft.pairs.codebases import hf_llama, meta_llama
def meta(): return meta_llama()
def transformers_llama(): return hf_llama()
'''


@pytest.fixture
def llama(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "mymodels.py").write_text(MODELS)
    source = randomise(hf_llama())
    source.save_pretrained(tmp_path / "llama")
    return tmp_path / "mymodels.py", tmp_path / "llama"


@pytest.mark.slow
def test_a_folder_is_verified(run: Run, tmp_path: Path, llama: tuple[Path, Path]) -> None:
    models, folder = llama
    done = run("graft", str(folder), "--model", f"{models}:meta", "--out",
               str(tmp_path / "out.safetensors"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == "ok" and set(report["evidence"].values()) == {"verified"}
    assert "LlamaForCausalLM" in report["verified_with"]


@pytest.mark.slow
def test_source_model_and_inputs_from_a_file(run: Run, tmp_path: Path,
                                             llama: tuple[Path, Path]) -> None:
    models, _folder = llama
    torch.save(randomise(hf_llama()).state_dict(), tmp_path / "llama.pt")
    save_file({"input_ids": torch.tensor([[1, 5, 9, 2]])}, str(tmp_path / "inputs.safetensors"))
    done = run("graft", str(tmp_path / "llama.pt"), "--model", f"{models}:meta", "--out",
               str(tmp_path / "out.safetensors"), "--source-model",
               f"{models}:transformers_llama", "--inputs", str(tmp_path / "inputs.safetensors"),
               "--verify", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == "ok" and report["max_abs_diff"] is not None
    bare = run("graft", str(tmp_path / "llama.pt"), "--model", f"{models}:meta", "--out",
               str(tmp_path / "bare.safetensors"), "--verify")
    assert bare.returncode == 2
    assert "--verify needs something to compare with" in bare.stderr
    assert "verify=True" not in bare.stderr  # the flag, not the Python argument
