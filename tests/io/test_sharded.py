"""Sharded checkpoints: *.index.json over safetensors shards (transformers) or .bin shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import torchgraft as tg
from tests.helpers import assert_same_state

transformers = pytest.importorskip("transformers")


def _gpt2(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100,
                                     n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    folder = tmp_path / "gpt2"
    model.save_pretrained(folder, max_shard_size="20KB")
    return folder, model.state_dict()


def test_transformers_sharded_folder(tmp_path: Path) -> None:
    folder, state = _gpt2(tmp_path)
    index = folder / "model.safetensors.index.json"
    assert index.is_file() and len(list(folder.glob("*.safetensors"))) > 2
    for path in (index, folder):
        with tg.open(path) as ckpt:
            assert ckpt.format == "sharded"
            loaded = {k: ckpt.get(k) for k in ckpt.keys()}
        saved = {k: v for k, v in state.items() if k in loaded}
        assert "lm_head.weight" not in loaded  # tied to the embedding: transformers drops it
        assert_same_state(loaded, saved, ordered=False)


def test_bin_shards(tmp_path: Path, state: dict[str, torch.Tensor]) -> None:
    names = list(state)
    weight_map = {}
    for i, part in enumerate((names[:3], names[3:]), start=1):
        shard = f"pytorch_model-{i:05d}-of-00002.bin"
        torch.save({n: state[n] for n in part}, tmp_path / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (tmp_path / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}))
    assert_same_state(tg.load(tmp_path), state)
    with tg.open(tmp_path) as ckpt:
        assert ckpt.extras == {"__metadata__": {"total_size": 1}}


def test_index_naming_a_missing_shard_or_tensor(tmp_path: Path) -> None:
    torch.save({"a": torch.ones(1)}, tmp_path / "one.bin")
    index = tmp_path / "model.bin.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "one.bin", "b": "two.bin"}}))
    with pytest.raises(tg.CheckpointNotFoundError, match="two.bin"):
        tg.open(index)
    index.write_text(json.dumps({"weight_map": {"a": "one.bin", "b": "one.bin"}}))
    with pytest.raises(tg.CorruptCheckpointError, match="'b'"):
        tg.open(index)
    index.write_text("{not json")
    with pytest.raises(tg.CorruptCheckpointError, match="not valid JSON"):
        tg.open(index)
