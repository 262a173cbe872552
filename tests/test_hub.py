"""Hub repository ids (``org/name[@revision]``) open from the local cache, offline.

The cache is written by huggingface_hub itself (``hf_hub_download`` from a server on
127.0.0.1, tests/hub_cache.py) with a sharded transformers ``save_pretrained`` model; its
snapshot files are links into ``blobs/``. inspect, load, convert, graft and the CLI take the
id; the weights equal what transformers' own ``from_pretrained`` loads from the same folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import torchgraft as tg
from tests import hub_cache
from tests.helpers import assert_same_state
from torchgraft.cli.main import main

transformers = pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")

MODELS = '''
import transformers
def tiny_llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False))
'''


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A sharded tiny Llama in a Hub cache: (the cache, the models file to build it)."""
    root = tmp_path_factory.mktemp("hub")
    (root / "tinymodels.py").write_text(MODELS)
    sys.path.insert(0, str(root))
    try:
        import tinymodels  # type: ignore[import-not-found]

        torch.manual_seed(0)
        model = tinymodels.tiny_llama()
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("tinymodels", None)
    written = root / "written"
    model.save_pretrained(written, max_shard_size="20KB")
    files = {p.name: p.read_bytes() for p in written.iterdir()}
    assert len([n for n in files if n.endswith(".safetensors")]) >= 2
    snapshot = hub_cache.download(files, root / "cache", "org/tiny-llama")
    assert (snapshot / "model.safetensors.index.json").is_symlink()
    return root / "cache", root / "tinymodels.py"


@pytest.fixture
def cache(cached: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cached[0]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cached[0]


def _library(cache: Path) -> tuple[Path, torch.nn.Module]:
    snapshot = cache / "models--org--tiny-llama" / "snapshots" / hub_cache.COMMIT
    model = transformers.LlamaForCausalLM.from_pretrained(snapshot).eval()
    return snapshot, model


def test_a_repo_id_opens_inspects_and_converts_from_the_cache(cache: Path,
                                                                tmp_path: Path) -> None:
    snapshot, model = _library(cache)
    expected = model.state_dict()
    for spelled in ("org/tiny-llama", f"org/tiny-llama@{hub_cache.COMMIT}", "org/tiny-llama@main"):
        with tg.open(spelled) as ckpt:
            assert ckpt.format == "sharded"
            assert ckpt.path == snapshot / "model.safetensors.index.json"
        assert_same_state(tg.load(spelled), expected, ordered=False)
    assert tg.inspect("org/tiny-llama").totals.tensors == len(expected)
    report = tg.convert("org/tiny-llama", tmp_path / "llama.safetensors")
    assert report.wrappers_removed == ""
    assert_same_state(load_file(tmp_path / "llama.safetensors"), expected, ordered=False)


def test_a_repo_id_grafts_like_from_pretrained(cache: Path, cached: tuple[Path, Path]) -> None:
    _snapshot, model = _library(cache)
    torch.manual_seed(1)
    target = transformers.LlamaForCausalLM(model.config).eval()
    report = tg.graft("org/tiny-llama", target)
    assert report.ok and not report.missing and not report.unused
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    assert torch.equal(target(ids).logits, model(ids).logits)


def test_the_cli_takes_a_repo_id(cache: Path, cached: tuple[Path, Path], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    _snapshot, model = _library(cache)
    assert main(["inspect", "org/tiny-llama", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "sharded"
    out = tmp_path / "grafted.safetensors"
    assert main(["graft", "org/tiny-llama", "--model", f"{cached[1]}:tiny_llama", "--out",
                 str(out), "--quiet"]) == 0
    assert_same_state(load_file(out), model.state_dict(), ordered=False)
    assert main(["convert", "org/tiny-llama@main", str(tmp_path / "c.safetensors"),
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["inspect", "org/not-downloaded"]) == 2
    assert "no Hugging Face Hub repository 'org/not-downloaded'" in capsys.readouterr().err


def test_what_is_not_cached_or_not_installed_says_so(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(tg.CheckpointNotFoundError,
                       match=r"Hub repository 'org/absent'.*hf download org/absent"):
        tg.open("org/absent")
    with pytest.raises(tg.CheckpointNotFoundError, match=r"'org/tiny-llama' at revision 'v9'"):
        tg.open("org/tiny-llama@v9")
    with pytest.raises(tg.CheckpointNotFoundError, match="^no/such/file.pt: no such file"):
        tg.open("no/such/file.pt")  # three parts: a path, not an id
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
    with pytest.raises(tg.CheckpointNotFoundError, match="pip install huggingface_hub"):
        tg.open("org/tiny-llama")
