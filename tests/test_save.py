"""tg.save: every format read back by the real consumer; atomic, refusing to overwrite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

import torchgraft as tg
from tests.helpers import SmallNet, assert_same_state, small_net
from tests.models import NanoGPT, ResNet18, pretrained_resnet18


def test_module_is_unwrapped_and_saved_from_cpu(tmp_path: Path, model: SmallNet) -> None:
    path = tmp_path / "m.pt"
    tg.save(nn.DataParallel(torch.compile(model)), path)
    assert_same_state(torch.load(path, weights_only=True), model.state_dict())


def test_legacy_file_is_pre_1_6_layout_and_loads_bit_for_bit(tmp_path: Path,
                                                             model: SmallNet) -> None:
    path = tmp_path / "old.pth"
    tg.save(model, path, legacy=True)
    assert not zipfile.is_zipfile(path)
    assert path.read_bytes()[:2] == b"\x80\x02"  # pickle protocol 2, as PyTorch 1.0-1.5 wrote
    assert_same_state(torch.load(path, weights_only=True), model.state_dict())
    assert tg.open(path).format == "torch-legacy"


def test_safetensors_tied_noncontiguous_metadata(tmp_path: Path) -> None:
    gpt = NanoGPT(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16)
    state = {**gpt.state_dict(), "transposed": torch.randn(4, 6).t()}
    path = tmp_path / "gpt.safetensors"
    tg.save(state, path, metadata={"format": "pt", "step": 12})  # type: ignore[dict-item]
    with safe_open(str(path), "pt") as f:
        stored = set(f.keys())
        assert f.metadata()["step"] == "12"
    assert ("lm_head.weight" in stored) != ("transformer.wte.weight" in stored)  # once
    plain = load_file(path)
    assert torch.equal(plain["transposed"], state["transposed"])
    loaded = tg.load(path)
    assert_same_state(loaded, state, ordered=False)
    assert loaded["lm_head.weight"].data_ptr() == loaded["transformer.wte.weight"].data_ptr()


def test_dtype_casts_floats_only(tmp_path: Path, model: SmallNet) -> None:
    for fmt, name in (("safetensors", "a.safetensors"), ("torch", "a.pt"), ("numpy", "a.npz")):
        path = tmp_path / name
        tg.save(model, path, dtype=torch.float16 if fmt == "numpy" else "bf16")
        loaded = tg.load(path)
        assert loaded["conv.weight"].dtype in (torch.bfloat16, torch.float16)
        assert loaded["bn.num_batches_tracked"].dtype == torch.int64
        assert torch.equal(loaded["bn.num_batches_tracked"],
                           model.state_dict()["bn.num_batches_tracked"])


def test_numpy_npz_loads_in_numpy(tmp_path: Path, model: SmallNet) -> None:
    path = tmp_path / "w.npz"
    tg.save(model, path)
    with np.load(path, allow_pickle=False) as arrays:
        for name, tensor in model.state_dict().items():
            assert np.array_equal(arrays[name], tensor.numpy())
    with pytest.raises(tg.UnsupportedCheckpointError, match="bfloat16, which numpy cannot store"):
        tg.save({"w": torch.ones(2).bfloat16()}, tmp_path / "bf.npz")


def test_sharded_safetensors_load_in_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100,
                                     n_positions=16, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    source = transformers.GPT2LMHeadModel(config).eval()
    folder = tmp_path / "gpt2"
    written = tg.save(source, folder / "model.safetensors", max_shard_size="40KB")
    assert len(written) > 3 and written[-1].name == "model.safetensors.index.json"
    config.save_pretrained(folder)
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    idx = torch.randint(0, 100, (1, 8))
    with torch.no_grad():
        assert torch.equal(reloaded(idx).logits, source(idx).logits)
    assert_same_state(tg.load(folder), source.state_dict(), ordered=False)


def test_sharded_torch_bins(tmp_path: Path, model: SmallNet) -> None:
    written = tg.save(model, tmp_path / "pytorch_model.bin", max_shard_size=200)
    assert written[0].name == "pytorch_model-00001-of-00003.bin"
    assert written[-1].name == "pytorch_model.bin.index.json"
    assert_same_state(tg.load(tmp_path), model.state_dict())


def test_refuses_to_overwrite_and_keeps_the_file(tmp_path: Path, model: SmallNet) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"precious")
    with pytest.raises(tg.TorchgraftError, match="already exists"):
        tg.save(model, path)
    assert path.read_bytes() == b"precious"
    tg.save(model, path, overwrite=True)
    assert_same_state(tg.load(path), model.state_dict(), ordered=False)


def test_format_errors(tmp_path: Path, model: SmallNet) -> None:
    with pytest.raises(tg.TorchgraftError, match="cannot tell the format"):
        tg.save(model, tmp_path / "m.weird")
    with pytest.raises(tg.TorchgraftError, match="legacy=True is for torch"):
        tg.save(model, tmp_path / "m.safetensors", legacy=True)
    with pytest.raises(tg.TorchgraftError, match="metadata is stored by safetensors"):
        tg.save(model, tmp_path / "m.pt", metadata={"a": "b"})
    with pytest.raises(tg.UnsupportedCheckpointError, match="needs the model"):
        tg.save(model.state_dict(), tmp_path / "m.pdparams")


def test_dcp_directory(tmp_path: Path, model: SmallNet) -> None:
    tg.save(model, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / ".metadata").is_file()
    assert_same_state(tg.load(tmp_path / "ckpt"), model.state_dict(), ordered=False)


@pytest.mark.slow
def test_paddle_round_trip_resnet18(tmp_path: Path) -> None:
    paddle = pytest.importorskip("paddle")
    from paddle.vision.models import resnet18

    model = pretrained_resnet18(num_classes=10)
    path = tmp_path / "resnet18.pdparams"
    tg.save(model, path)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = model(x).numpy()

    twin = resnet18(num_classes=10)
    missing, unexpected = twin.set_state_dict(paddle.load(str(path)))
    assert not missing and not unexpected
    twin.eval()
    from_paddle = twin(paddle.to_tensor(x.numpy())).numpy()
    assert np.abs(from_paddle - expected).max() <= 1e-4 * np.abs(expected).max()

    back = ResNet18(num_classes=10).eval()
    assert tg.graft(path, back).ok
    with torch.no_grad():
        np.testing.assert_allclose(back(x).numpy(), expected, rtol=1e-5, atol=1e-5)


_KILLED_WRITER = """
import sys, torch, torchgraft as tg
state = {f"w{i}": torch.randn(1024, 1024) for i in range(192)}  # 768 MiB
print("writing", flush=True)
tg.save(state, sys.argv[1], overwrite=True)
"""


def _bytes_being_written(pid: int, folder: Path) -> int:
    """The size of the largest file in ``folder`` that process ``pid`` holds open.

    A temporary without a name (``O_TMPFILE``) is seen this way too.
    """
    sizes = [0]
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd).startswith(str(folder)):
                sizes.append(os.stat(fd).st_size)
        except OSError:
            continue
    return max(sizes)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["big.safetensors", "big.pt"])
def test_killed_mid_write_leaves_the_old_file(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    tg.save({"old": torch.ones(3)}, path)
    before = path.read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if _bytes_being_written(proc.pid, tmp_path) > 50 * 2**20:
            break
        time.sleep(0.01)
    else:
        proc.kill()
        pytest.fail("the writer never started writing")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert path.read_bytes() == before
    assert torch.equal(tg.load(path)["old"], torch.ones(3))


@pytest.mark.slow
def test_seed_everything_makes_training_repeatable() -> None:
    def train() -> dict[str, torch.Tensor]:
        tg.seed_everything(1234, deterministic=True)
        net = small_net(int(torch.randint(0, 1000, ()).item()))
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(3):
            x = torch.randn(4, 3, 8, 8)
            loss = net(nn.functional.dropout(x, 0.5)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return {k: v.clone() for k, v in net.state_dict().items()}

    try:
        first, second = train(), train()
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(False)
    assert_same_state(first, second)
    tg.seed_everything(1)
    a = (np.random.rand(), torch.rand(1))
    tg.seed_everything(1)
    assert (np.random.rand(), torch.rand(1)) == a


def test_written_safetensors_load_in_huggingface_hub(tmp_path: Path, model: SmallNet) -> None:
    hub = pytest.importorskip("huggingface_hub")
    single = tmp_path / "single" / "model.safetensors"
    tg.save(model, single)
    assert_same_state(hub.load_state_dict_from_file(single), model.state_dict(), ordered=False)
    tg.save(model, tmp_path / "sharded" / "model.safetensors", max_shard_size=200)
    fresh = SmallNet()
    hub.load_torch_model(fresh, tmp_path / "sharded")
    assert_same_state(fresh.state_dict(), model.state_dict())
    converted = tmp_path / "converted.safetensors"
    tg.convert(single, converted)
    assert_same_state(hub.load_state_dict_from_file(converted), model.state_dict(),
                      ordered=False)


def _state(value: float) -> dict[str, torch.Tensor]:
    return {f"layer{i}.weight": torch.full((8, 8), value) for i in range(4)}


def test_sharded_overwrite_is_one_commit(tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    first = tg.save(_state(1.0), target, max_shard_size=300)
    assert first[0].name == "model-00001-of-00004.safetensors"
    second = tg.save(_state(2.0), target, max_shard_size=300, overwrite=True)
    tagged = [p.name for p in second[:-1]]
    assert all(n.startswith("model-") and n != f.name
               for n, f in zip(tagged, first[:-1], strict=True))
    assert all(torch.equal(v, torch.full((8, 8), 2.0)) for v in tg.load(tmp_path).values())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([*tagged, "model.safetensors.index.json"])  # old shards removed
    third = tg.save(_state(3.0), target, max_shard_size=300, overwrite=True)
    assert third[0].name == "model-00001-of-00004.safetensors"  # the usual names were free
    with pytest.raises(tg.TorchgraftError, match="already exists"):
        tg.save(_state(4.0), target, max_shard_size=300)


def test_sharded_overwrite_killed_before_its_commit_keeps_the_old(tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    tg.save(_state(1.0), target, max_shard_size=300)
    # A killed overwrite: new shards (tagged) written, the index never replaced.
    from safetensors.torch import save_file

    for n in range(1, 5):
        save_file({f"layer{n - 1}.weight": torch.full((8, 8), 9.0)},
                  tmp_path / f"model-0123abcd-{n:05d}-of-00004.safetensors")
    assert all(torch.equal(v, torch.full((8, 8), 1.0)) for v in tg.load(tmp_path).values())
    tg.save(_state(2.0), target, max_shard_size=300, overwrite=True)
    assert not list(tmp_path.glob("model-0123abcd-*"))  # what the killed write left is gone
    assert all(torch.equal(v, torch.full((8, 8), 2.0)) for v in tg.load(tmp_path).values())
