"""The fine-tuning flow through the entry point: a BERT ``save_pretrained`` folder into
``BertForSequenceClassification`` ends INCOMPLETE, and the output itself proposes the one flag
(``--new classifier``) whose command ends it done; a pattern naming nothing lists the near
misses; an UNVERIFIED graft is saved by ``--allow-unverified``, not ``--allow-incomplete``'s
advice; the library's warning is not printed twice. Each case with its control."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

Run = Callable[..., subprocess.CompletedProcess[str]]

pytestmark = pytest.mark.slow

MODELS = '''
import transformers

def classifier(folder, layers=None):
    config = transformers.BertConfig.from_pretrained(folder, num_labels=3)
    if layers is not None:
        config.num_hidden_layers = layers
    return transformers.BertForSequenceClassification(config)

def encoder(folder, layers):
    config = transformers.BertConfig.from_pretrained(folder)
    config.num_hidden_layers = layers
    return transformers.BertModel(config)
'''


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT folder written by transformers' own ``save_pretrained``, and a models file."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=32)
    transformers.BertModel(config).save_pretrained(folder / "bert-base")
    (folder / "mymodels.py").write_text(MODELS)
    return folder


def _graft(bert: Path, factory: str, kwargs: str, *rest: str) -> list[str]:
    return ["graft", str(bert / "bert-base"), "--model", f"{bert / 'mymodels.py'}:{factory}",
            "--model-kwargs", kwargs, *rest]


def test_a_new_classifier_is_done_with_the_one_flag_the_output_proposes(run: Run,
                                                                         bert: Path) -> None:
    folder = f'{{"folder": "{bert / "bert-base"}"}}'
    out = bert / "classifier.safetensors"
    first = run(*_graft(bert, "classifier", folder, "--out", str(out)))
    assert first.returncode == 1 and not out.exists(), first.stdout + first.stderr
    assert "missing   classifier (2 keys)" in first.stdout
    assert "--new classifier" in first.stdout  # the summary's row proposes it
    assert "if 'classifier' is new on purpose, add --new classifier" in first.stderr
    assert "TorchgraftWarning" not in first.stderr and "WARNING" not in first.stderr
    command = shlex.split(first.stdout.splitlines()[-1])  # the command printed to copy
    assert command[:2] == ["torchgraft", "graft"] and command[-2:] == ["--new", "classifier"]
    done = run(*command[1:])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("graft ok: 39 loaded, 39 renamed, 2 new")
    assert f"saved {out}" in done.stdout
    from safetensors.torch import load_file

    saved = load_file(out)
    stored = load_file(bert / "bert-base" / "model.safetensors")
    assert torch.equal(saved["bert.encoder.layer.1.output.dense.weight"],
                       stored["encoder.layer.1.output.dense.weight"])


def test_a_missing_inner_layer_is_not_proposed_as_new(run: Run, bert: Path) -> None:
    """The control: an encoder layer the checkpoint lacks is no head: no --new proposed."""
    folder = f'{{"folder": "{bert / "bert-base"}", "layers": 3}}'
    result = run(*_graft(bert, "encoder", folder, "--out", str(bert / "deeper.safetensors")))
    assert result.returncode == 1 and "missing" in result.stdout
    assert "--new encoder" not in result.stdout + result.stderr
    assert "add --new" not in result.stderr and "--allow-incomplete" in result.stderr


def test_a_pattern_naming_nothing_lists_the_near_misses(run: Run, bert: Path) -> None:
    folder = f'{{"folder": "{bert / "bert-base"}"}}'
    missed = run(*_graft(bert, "classifier", folder, "--new", "head.*", "--dry-run"))
    assert missed.returncode == 2 and len(missed.stderr.splitlines()) == 1
    assert "--new head.* names no key of the model" in missed.stderr
    assert "nearest names in it are 'classifier'" in missed.stderr
    assert "word_embeddings" not in missed.stderr  # not the model's first keys
    named = run(*_graft(bert, "classifier", folder, "--new", "classifier", "--dry-run"))
    assert named.returncode == 0  # the control


GUESSING = '''
from torch import nn
def net():
    m = nn.Sequential()
    m.a, m.b = nn.LayerNorm(4), nn.LayerNorm(4)
    return m
'''


def test_allow_unverified_saves_an_unverified_graft_and_only_that(run: Run,
                                                                  tmp_path: Path) -> None:
    (tmp_path / "guessing.py").write_text(GUESSING)
    source = torch.nn.Sequential()
    source.p, source.r = torch.nn.LayerNorm(4), torch.nn.LayerNorm(4)
    torch.save(source.state_dict(), tmp_path / "norms.pt")
    graft = ["graft", str(tmp_path / "norms.pt"), "--model", f"{tmp_path / 'guessing.py'}:net"]
    refused = run(*graft, "--out", str(tmp_path / "a.pt"))
    assert refused.returncode == 3 and "--allow-unverified saves it anyway" in refused.stderr
    saved = run(*graft, "--out", str(tmp_path / "a.pt"), "--allow-unverified")
    assert saved.returncode == 5 and (tmp_path / "a.pt").is_file()
    # the control: --allow-unverified does not save a graft with keys missing
    torch.save({"p.weight": torch.ones(4)}, tmp_path / "part.pt")
    partial = ["graft", str(tmp_path / "part.pt"), "--model", f"{tmp_path / 'guessing.py'}:net"]
    incomplete = run(*partial, "--out", str(tmp_path / "b.pt"), "--allow-unverified")
    assert incomplete.returncode == 1 and not (tmp_path / "b.pt").exists()
    assert "--allow-incomplete saves it anyway" in incomplete.stderr
