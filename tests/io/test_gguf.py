"""GGUF files written by gguf-py's GGUFWriter (llama.cpp's writer), grafted into transformers."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import torchgraft as tg
from tests.helpers import BOUNDED, calls
from torchgraft.errors import CorruptCheckpointError, TorchgraftError
from torchgraft.graft.evidence import Verdict
from torchgraft.graft.plan.passes import ROTARY_ORDER

FIXTURES = Path(__file__).parent.parent / "fixtures" / "frameworks" / "gguf"
LLAMA = FIXTURES / "llama_mixed.gguf"
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")


def _llama(**changes: int) -> torch.nn.Module:
    settings = {"vocab_size": 64, "hidden_size": 256, "intermediate_size": 256,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 64, **changes}
    config = transformers.LlamaConfig(tie_word_embeddings=False, rope_theta=10000.0, **settings)
    return transformers.LlamaForCausalLM(config).eval()


def test_quantized_llama_grafts_with_outputs_of_the_dequantized_weights() -> None:
    io = np.load(FIXTURES / "llama_mixed_io.npz")
    model = _llama()
    report = tg.graft(LLAMA, model)
    assert report.ok, report
    with torch.no_grad():
        logits = model(torch.from_numpy(io["ids"])).logits.numpy()
    # Q8_0, Q4_0, Q4_K, Q5_K, Q6_K dequantized exactly as gguf-py and llama.cpp do (bit for bit:
    # the next test), and q/k rotary rows un-interleaved with the file's head counts: the
    # logits computed when the fixture was written. They were computed on another CPU, whose
    # matrix kernels sum in another order, so they agree to float32 rounding, not bit for bit.
    scale = float(np.abs(io["logits"]).max())
    np.testing.assert_allclose(logits, io["logits"], rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("part", ["self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj",
                                  "mlp.up_proj", "mlp.down_proj"])
def test_k_quants_written_by_llama_cpp_read_as_llama_cpp_dequantizes_them(part: str) -> None:
    # The Q4_K/Q5_K/Q6_K blocks come from llama.cpp's quantizer (ggml_quantize_chunk); its own
    # to_float of them is in the fixture. q_proj's rows are rotary-permuted in the file.
    io = np.load(FIXTURES / "llama_mixed_io.npz")
    with tg.open(LLAMA) as ckpt:
        weight = ckpt.get(f"model.layers.0.{part}.weight")
        other_layer = ckpt.get(f"model.layers.1.{part}.weight")
    np.testing.assert_array_equal(weight.numpy(), io[f"ggml_{part}"])
    assert not np.array_equal(other_layer.numpy(), io[f"ggml_{part}"])


def test_k_quant_error_is_what_llama_cpp_gets() -> None:
    io = np.load(FIXTURES / "llama_mixed_io.npz")
    # relative RMS error of llama.cpp's own dequantized weights against the float weights
    for qtype, bound in (("Q4_K", 0.08), ("Q5_K", 0.04), ("Q6_K", 0.02)):
        assert (io[f"rel_rms_error_{qtype}"] < bound).all(), qtype


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_qwen2_with_biases_and_tied_embeddings_grafts(precision: str) -> None:
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=True, rope_theta=10000.0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    path = FIXTURES / f"qwen2_{precision}.gguf"
    with tg.open(path) as ckpt:  # F16/BF16 matrices are read as stored, memory-mapped
        assert ckpt["model.layers.0.mlp.up_proj.weight"].dtype == getattr(torch, {
            "f16": "float16", "bf16": "bfloat16"}[precision])
    report = tg.graft(path, model)
    assert report.ok, report
    io = np.load(FIXTURES / f"qwen2_{precision}_io.npz")
    with torch.no_grad():
        logits = model(torch.from_numpy(io["ids"])).logits.numpy()
    np.testing.assert_allclose(logits, io["logits"], rtol=0, atol=1e-6)


def test_other_head_counts_with_the_same_shapes_are_never_ok() -> None:
    report = tg.graft(LLAMA, _llama(num_attention_heads=8, num_key_value_heads=4), strict=False)
    assert not report.ok
    assert "heads of size 64" in report.reasons["model.layers.0.self_attn.q_proj.weight"]



def test_mistral_gets_the_weights_llama_gets() -> None:
    """llama.cpp writes Mistral as architecture ``llama`` (q/k rows permuted alike)."""
    config = transformers.MistralConfig(vocab_size=64, hidden_size=256, intermediate_size=256,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=64,
                                        tie_word_embeddings=False, rope_theta=10000.0,
                                        sliding_window=None, rms_norm_eps=1e-6)
    mistral, llama = transformers.MistralForCausalLM(config).eval(), _llama()
    report = tg.graft(LLAMA, mistral)
    assert report.ok, report
    assert tg.graft(LLAMA, llama).ok
    for name, tensor in llama.state_dict().items():
        assert torch.equal(mistral.state_dict()[name], tensor), name
    io = np.load(FIXTURES / "llama_mixed_io.npz")
    with torch.no_grad():
        logits = mistral(torch.from_numpy(io["ids"])).logits.numpy()
    # Mistral's code computes in another order than Llama's: measured 4.5e-7 (logits up to 0.76).
    np.testing.assert_allclose(logits, io["logits"], rtol=0, atol=1e-5)


def test_a_hand_written_meta_llama_grafts_and_other_head_counts_never_do() -> None:
    """Meta's reference layout (wq/wk/.., rotary on interleaved pairs): the file's rows are
    un-permuted on read and permuted to Meta's order by the graft, with the file's head size.
    Meta's names do not say the model computes in Meta's order: unverified until outputs are
    compared with the file's own model (``source_model=``, ``verify=True``), then ok."""
    from tests.models import MetaLlama

    model = MetaLlama(64, 256, 2, 4, 2, 256, eps=1e-6).eval()
    report = tg.graft(LLAMA, model)
    assert report.verdict is Verdict.UNVERIFIED and [a.what for a in report.assumptions] == [
        ROTARY_ORDER], report
    assert "rotary rows permuted" in str(report)
    io = np.load(FIXTURES / "llama_mixed_io.npz")
    with torch.no_grad():
        logits = model(torch.from_numpy(io["ids"])).numpy()
    # Meta's rotary is computed as complex pairs: measured 4.5e-7 (logits up to 0.76).
    np.testing.assert_allclose(logits, io["logits"], rtol=0, atol=1e-5)
    checked = tg.graft(LLAMA, MetaLlama(64, 256, 2, 4, 2, 256, eps=1e-6).eval(),
                       source_model=_llama, verify=True)  # float16 matrices cast: asked for
    assert checked.ok and checked.verified_with, checked
    for heads, kv_heads in ((8, 4), (2, 1)):  # same shapes, other head sizes
        assert not tg.graft(LLAMA, MetaLlama(64, 256, 2, heads, kv_heads, 256), strict=False).ok

def test_inspect_shows_framework_architecture_and_quantization() -> None:
    info = tg.inspect(LLAMA)
    assert info.format == "gguf"
    metadata = info.extras["__metadata__"]
    assert metadata["framework"] == "gguf" and metadata["architecture"] == "llama"
    assert metadata["quantization"] == {"Q4_K": 4, "Q8_0": 3, "Q4_0": 2, "Q6_K": 4, "Q5_K": 2,
                                        "F32": 5, "F16": 1}
    assert metadata["metadata"]["llama.attention.head_count"] == 4
    names = [name for name, _ in info.tensors]
    assert "model.layers.1.self_attn.q_proj.weight" in names and "lm_head.weight" in names


def test_convert_to_safetensors_keeps_dequantized_values(tmp_path: Path) -> None:
    out = tmp_path / "llama.safetensors"
    tg.convert(LLAMA, out)
    with tg.open(LLAMA) as source, tg.open(out) as converted:
        assert converted.format == "safetensors"
        for name in ("model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight",
                     "lm_head.weight"):
            torch.testing.assert_close(converted[name], source[name], rtol=0, atol=0)


def test_a_layer_more_is_never_ok() -> None:
    report = tg.graft(LLAMA, _llama(num_hidden_layers=3), strict=False)
    assert not report.ok


def test_a_missing_head_count_is_an_error(tmp_path: Path) -> None:
    data = bytearray(LLAMA.read_bytes())
    key = b"llama.attention.head_count"  # the first one is the query heads' (then _kv)
    at = data.index(key)
    data[at:at + len(key)] = b"llama.attention.head_cnt_xx"
    broken = tmp_path / "no_heads.gguf"
    broken.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="head_count"):
        tg.open(broken)


def _header(tensor_count: int, kv_count: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, kv_count)


@pytest.mark.parametrize("data", [
    pytest.param(_header(2**40, 0), id="tensor-count"),
    pytest.param(_header(0, 1) + struct.pack("<Q", 2**40), id="key-length"),
    pytest.param(_header(0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<II", 9, 9)
                 + struct.pack("<Q", 2**40), id="array-length"),
    pytest.param(_header(0, 1) + struct.pack("<Q", 1) + b"k"
                 + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 50, id="array-nesting"),
    pytest.param(_header(1, 0) + struct.pack("<Q", 1) + b"w" + struct.pack("<I", 2)
                 + struct.pack("<QQ", 2**20, 2**20) + struct.pack("<IQ", 0, 0), id="2^40-elements"),
    pytest.param(_header(1, 0) + struct.pack("<Q", 1) + b"w" + struct.pack("<I", 1)
                 + struct.pack("<Q", 4) + struct.pack("<IQ", 0, 2**50), id="offset-past-end"),
])
def test_bad_headers_are_errors_in_bounded_time(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data + bytes(64))
    def refused() -> None:
        with pytest.raises(CorruptCheckpointError):
            tg.open(path)

    assert calls(refused) < BOUNDED  # not a walk of what the header claims


def test_truncated_file_is_an_error(tmp_path: Path) -> None:
    data = LLAMA.read_bytes()
    for cut in (10, 200, len(data) - 1000):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(TorchgraftError):
            tg.load(path)
