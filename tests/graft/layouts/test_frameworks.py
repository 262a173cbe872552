"""Real third-party models: Paddle ResNet-18 from .pdparams, transformers GPT-2 into nanoGPT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import torchgraft as tg
from tests.helpers import paddle_resnet18
from tests.models import NanoGPT, ResNet18


@pytest.mark.slow
def test_paddle_resnet18_pdparams_into_pytorch(tmp_path: Path) -> None:
    paddle = pytest.importorskip("paddle")
    source = paddle_resnet18()
    path = tmp_path / "resnet18.pdparams"
    paddle.save(source.state_dict(), str(path))
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    expected = source(paddle.to_tensor(x)).numpy()

    model = ResNet18(num_classes=10).eval()
    report = tg.graft(path, model, strict=True)
    assert report.ok
    assert report.adapted == {"fc.weight": "transposed (Paddle stores Linear weights as [in, out])"}
    assert report.mapping["bn1.running_var"] == "bn1._variance"
    assert report.matched_by["layer1.0.bn1.running_mean"] == "layout"
    assert all(k.endswith("num_batches_tracked") for k in report.missing)
    with torch.no_grad():
        logits = model(torch.from_numpy(x)).numpy()
    scale = np.abs(expected).max()
    assert np.abs(logits - expected).max() <= 1e-4 * scale


def test_transformers_gpt2_into_nanogpt() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                     n_positions=32, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    source = transformers.GPT2LMHeadModel(config).eval()
    model = NanoGPT(vocab_size=128, block_size=32, n_layer=2, n_head=4, n_embd=64).eval()
    idx = torch.randint(0, 128, (2, 16))
    report = tg.graft(source, model, example_inputs=(idx,), verify=True, strict=True)
    transposed = {k for k, v in report.adapted.items() if v.startswith("transposed")}
    assert transposed == {f"transformer.h.{i}.{m}.weight" for i in range(2)
                          for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    assert report.max_abs_diff is not None and report.max_abs_diff < 1e-4
    assert model.lm_head.weight is model.transformer.wte.weight
    assert torch.equal(model.lm_head.weight, source.lm_head.weight)
    with torch.no_grad():
        expected = source(idx).logits
        torch.testing.assert_close(model(idx), expected, rtol=1e-5, atol=1e-5)
