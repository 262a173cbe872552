"""Write the other frameworks' fixture files (tests/fixtures/frameworks/), with each one's writer.

Each subcommand runs in the environment that has its framework, never torchgraft's own:

    python scripts/make_framework_fixtures.py gguf      # gguf + transformers (the test venv)
    python scripts/make_framework_fixtures.py gguf-qwen2 gguf-qwen2-bf16    # the same
    /work/venvs/tf/bin/python scripts/make_framework_fixtures.py keras    # tensorflow, keras
    /work/venvs/tf/bin/python scripts/make_framework_fixtures.py keras-siblings   # the same
    /work/venvs/jax/bin/python scripts/make_framework_fixtures.py flax flax-bf16   # jax, flax
    /work/venvs/jax/bin/python scripts/make_framework_fixtures.py orbax   # + orbax-checkpoint
    /work/venvs/mlx/bin/python scripts/make_framework_fixtures.py mlx     # mlx
    /work/venvs/mlx/bin/python scripts/make_framework_fixtures.py mlx-modes  # mlx, mlx-lm
    /work/venvs/mlx/bin/python scripts/make_framework_fixtures.py mlx-convs  # mlx (mlx[cpu])
    /work/venvs/mlx/bin/python scripts/make_framework_fixtures.py mlx-whisper  # + mlx-whisper
    #   (mlx-whisper installed --no-deps, with tiktoken: only its model module is imported)

Every fixture is a tiny model with fixed seeds, saved by the framework's own save function,
with the framework's outputs for fixed inputs beside it (``*_io.npz``) so that tests check
equal outputs without the framework. Versions go to tests/fixtures/frameworks/MANIFEST.json.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "frameworks"


def _record(name: str, files: list[str], how: str, packages: list[str]) -> None:
    manifest_path = OUT / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest[name] = {"files": files, "how": how,
                      "versions": {p: importlib.metadata.version(p) for p in packages}}
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


# --- GGUF -----------------------------------------------------------------------------------

def _llama_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf ``LlamaModel.permute``: rotary rows interleaved."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _ggml() -> Any:
    """llama.cpp's ggml library (``libggml-base``): its quantizer and its dequantizer.

    Found in an installed llama-cpp-python (``pip install llama-cpp-python`` builds it), or at
    ``$GGML_LIB``. Only fixture writing loads it, never torchgraft.
    """
    import ctypes
    import importlib.util
    import os

    path = os.environ.get("GGML_LIB")
    if path is None:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or spec.origin is None:
            raise SystemExit("K-quant fixtures need llama.cpp's ggml: pip install "
                             "llama-cpp-python, or set GGML_LIB to a libggml-base.so")
        path = str(Path(spec.origin).parent / "lib" / "libggml-base.so")
    lib = ctypes.CDLL(path)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]

    class Traits(ctypes.Structure):  # ggml.h: struct ggml_type_traits
        _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                    ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                    ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                    ("from_float_ref", ctypes.c_void_p)]

    lib.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    return lib


def _ggml_quantize(lib: Any, weight: np.ndarray, qtype: int) -> np.ndarray:
    """``ggml_quantize_chunk``, as llama.cpp's quantize tool calls it (no importance matrix)."""
    rows, per_row = weight.shape
    traits = lib.ggml_get_type_traits(qtype).contents
    src = np.ascontiguousarray(weight, dtype=np.float32)
    out = np.zeros((rows, per_row // traits.blck_size * traits.type_size), np.uint8)
    written = lib.ggml_quantize_chunk(qtype, src.ctypes.data, out.ctypes.data, 0, rows, per_row,
                                      None)
    assert written == out.nbytes, (written, out.nbytes)
    return out


def _ggml_dequantize(lib: Any, codes: np.ndarray, qtype: int, shape: tuple[int, int],
                     ) -> np.ndarray:
    """llama.cpp's own dequantization (the type's ``to_float``)."""
    import ctypes

    to_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                                ctypes.c_int64)(lib.ggml_get_type_traits(qtype).contents.to_float)
    out = np.empty(shape, np.float32)
    data = np.ascontiguousarray(codes)
    to_float(data.ctypes.data, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size)
    return out


def make_gguf() -> None:
    """A tiny transformers Llama written by gguf-py's GGUFWriter, in several GGML types.

    Q8_0 and Q4_0 come from gguf.quants.quantize of the model's weights; Q4_K, Q5_K and Q6_K
    (gguf-py has no K-quantizer) from llama.cpp's own ``ggml_quantize_chunk`` (:func:`_ggml`).
    The model then takes the weights gguf.quants.dequantize reads from the file, so its
    weights are exactly what the file holds (the reference outputs are the transformers
    model's). Recorded beside: the float model's logits, llama.cpp's own dequantization
    (``to_float``) of layer 0's K-quant weights, and each quantization's error.
    """
    import gguf
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    q = gguf.GGMLQuantizationType
    ggml = _ggml()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=False,
                         rope_theta=10000.0)
    model = LlamaForCausalLM(config).eval()
    ids = torch.tensor([[1, 5, 9, 2, 33, 60, 7, 12]])
    with torch.no_grad():
        float_logits = model(ids).logits.numpy()
    types = {"self_attn.q_proj": q.Q4_K, "self_attn.k_proj": q.Q8_0, "self_attn.v_proj": q.Q4_0,
             "self_attn.o_proj": q.Q6_K, "mlp.gate_proj": q.Q5_K, "mlp.up_proj": q.Q4_K,
             "mlp.down_proj": q.Q6_K}
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    heads = {"self_attn.q_proj": config.num_attention_heads,
             "self_attn.k_proj": config.num_key_value_heads}
    path = OUT / "gguf" / "llama_mixed.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    extra: dict[str, np.ndarray] = {}
    errors: dict[str, list[float]] = {}
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    with torch.no_grad():
        state = model.state_dict()
        for i in range(config.num_hidden_layers):
            for part, gname in names.items():
                key = f"model.layers.{i}.{part}.weight"
                weight = state[key].numpy()
                qtype = types.get(part)
                if qtype is None:
                    writer.add_tensor(f"blk.{i}.{gname}.weight", weight)
                    continue
                if qtype in (q.Q4_K, q.Q5_K, q.Q6_K):
                    codes = _ggml_quantize(ggml, weight, qtype)
                    llama_cpp = _ggml_dequantize(ggml, codes, qtype, weight.shape)
                    if i == 0:
                        extra[f"ggml_{part}"] = llama_cpp
                    error = np.sqrt(np.mean((llama_cpp - weight) ** 2) / np.mean(weight ** 2))
                    errors.setdefault(qtype.name, []).append(float(error))
                else:
                    codes = gguf.quants.quantize(weight, qtype)
                exact = gguf.quants.dequantize(codes, qtype).astype(np.float32)
                state[key].copy_(torch.from_numpy(exact))
                if part in heads:
                    codes = _llama_permute(codes, heads[part])
                writer.add_tensor(f"blk.{i}.{gname}.weight", codes, raw_dtype=qtype)
        writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"].numpy()
                          .astype(np.float16))
        state["model.embed_tokens.weight"].copy_(
            state["model.embed_tokens.weight"].half().float())
        writer.add_tensor("output_norm.weight", state["model.norm.weight"].numpy())
        head = state["lm_head.weight"].numpy()
        head_codes = gguf.quants.quantize(head, q.Q8_0)
        state["lm_head.weight"].copy_(torch.from_numpy(
            gguf.quants.dequantize(head_codes, q.Q8_0).astype(np.float32)))
        writer.add_tensor("output.weight", head_codes, raw_dtype=q.Q8_0)
        logits = model(ids).logits.numpy()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    np.savez(OUT / "gguf" / "llama_mixed_io.npz", ids=ids.numpy(), logits=logits,
             float_logits=float_logits, **extra,
             **{f"rel_rms_error_{k}": np.array(v) for k, v in errors.items()})
    _record("gguf/llama_mixed", ["gguf/llama_mixed.gguf", "gguf/llama_mixed_io.npz"],
            "transformers LlamaForCausalLM (seed 0) written with gguf.GGUFWriter as llama.cpp's "
            "converter does (q/k rows permuted); Q8_0/Q4_0 by gguf.quants.quantize, Q4_K/Q5_K/"
            "Q6_K by llama.cpp's ggml_quantize_chunk (llama.cpp 0c1e570, ggml 0.25.3, from "
            "llama-cpp-python 0.3.36's sources), the model set to the file's "
            "gguf.quants.dequantize values; logits: the transformers model holding exactly the "
            "file's dequantized weights; float_logits: before quantization; ggml_*: llama.cpp's "
            "to_float of layer 0's K-quant weights (transformers' row order); rel_rms_error_*: "
            "llama.cpp's dequantized vs float weights, per tensor",
            ["gguf", "transformers", "torch", "numpy"])


def make_gguf_qwen2(precision: str = "f16") -> None:
    """A tiny transformers Qwen2 (q/k/v biases) written by GGUFWriter as llama.cpp writes it.

    Names mapped, rows not permuted (qwen2 is not rotary-permuted by the converter); F32 norms
    and biases, F16 (or BF16, as llama.cpp's ``--outtype bf16`` writes them) matrices.
    """
    import gguf
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    rounded = {"f16": torch.float16, "bf16": torch.bfloat16}[precision]

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=True,
                         rope_theta=10000.0)
    model = Qwen2ForCausalLM(config).eval()
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    path = OUT / "gguf" / f"qwen2_{precision}.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if value.dim() == 2:
                value.copy_(value.to(rounded).float())  # the file's values, exactly
            parts = key.split(".")
            if key == "model.embed_tokens.weight":
                gname = "token_embd.weight"
            elif key == "model.norm.weight":
                gname = "output_norm.weight"
            elif key == "lm_head.weight":
                continue  # tied to the embedding: llama.cpp writes no output.weight
            else:
                gname = f"blk.{parts[2]}.{names['.'.join(parts[3:-1])]}.{parts[-1]}"
            array = value.numpy()
            if array.ndim == 2 and precision == "bf16":
                kind = gguf.GGMLQuantizationType.BF16
                writer.add_tensor(gname, gguf.quants.quantize(array, kind), raw_dtype=kind)
            else:
                writer.add_tensor(gname, array.astype(np.float16) if array.ndim == 2 else array)
        ids = torch.tensor([[1, 5, 9, 2, 33, 60, 7, 12]])
        logits = model(ids).logits.numpy()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    np.savez(OUT / "gguf" / f"qwen2_{precision}_io.npz", ids=ids.numpy(), logits=logits)
    _record(f"gguf/qwen2_{precision}",
            [f"gguf/qwen2_{precision}.gguf", f"gguf/qwen2_{precision}_io.npz"],
            f"transformers Qwen2ForCausalLM (seed 0, tied embeddings, matrices rounded to "
            f"{precision.upper()}) written with gguf.GGUFWriter as llama.cpp's converter writes "
            "qwen2 (no row permutation); logits: the transformers model's",
            ["gguf", "transformers", "torch", "numpy"])


# --- Keras / TensorFlow ---------------------------------------------------------------------

def _randomise_keras(model: Any, rng: np.random.Generator) -> None:
    """Random values for every variable (BatchNorm statistics included), variances positive."""
    for variable in model.weights:
        shape = tuple(variable.shape)
        value = rng.standard_normal(shape).astype(np.float32) * 0.5
        if "variance" in getattr(variable, "path", variable.name):
            value = np.abs(value) + 0.5
        variable.assign(value)


def _legacy_cnn(seed: int, rng: np.random.Generator) -> Any:
    """tf.keras Sequential (tests' LegacyNet): Conv2D, BatchNormalization, Flatten, Dense."""
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    model = tf_keras.Sequential([
        tf_keras.layers.Conv2D(4, 3, input_shape=(8, 8, 3)),
        tf_keras.layers.BatchNormalization(),
        tf_keras.layers.Flatten(),
        tf_keras.layers.Dense(5),
    ])
    _randomise_keras(model, rng)
    return model


def make_keras() -> None:
    """Keras 3, tf.keras and transformers' TF models, saved by their own functions.

    Keras 3 models by model.save (.keras) and save_weights (.weights.h5); a tf.keras (Keras 2)
    model by save_weights to legacy HDF5; transformers' TFBertModel by save_pretrained
    (tf_model.h5). Outputs for fixed inputs beside each.
    """
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    from transformers import BertConfig, TFBertModel

    out = OUT / "keras"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    layers = keras.layers
    inputs = keras.Input((8, 8, 3))
    x = layers.Conv2D(4, 3, name="stem")(inputs)
    x = layers.BatchNormalization(name="stem_bn")(x)
    x = layers.ReLU()(x)
    x = layers.DepthwiseConv2D(3, padding="same", name="dw")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(6, name="fc")(x)
    x = layers.LayerNormalization(name="norm")(x)
    outputs = layers.Dense(3, name="head")(x)
    cnn = keras.Model(inputs, outputs)
    _randomise_keras(cnn, rng)
    image = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
    cnn.save(out / "cnn.keras")
    cnn.save_weights(out / "cnn.weights.h5")
    np.savez(out / "cnn_io.npz", x=image, y=np.asarray(cnn(image, training=False)))

    tokens = keras.Input((5,), dtype="int32")
    h = layers.Embedding(10, 8, name="embed")(tokens)
    h = layers.MultiHeadAttention(2, 4, name="attn")(h, h)
    h = layers.Dense(3, name="out")(h)
    attention = keras.Model(tokens, h)
    _randomise_keras(attention, rng)
    ids = rng.integers(0, 10, (2, 5)).astype(np.int32)
    attention.save(out / "attention.keras")
    np.savez(out / "attention_io.npz", ids=ids, y=np.asarray(attention(ids)))

    legacy = _legacy_cnn(0, rng)
    legacy.save_weights(str(out / "legacy.h5"))
    np.savez(out / "legacy_io.npz", x=image, y=legacy(image, training=False).numpy())

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=16)
    bert = TFBertModel(config)
    bert_ids = rng.integers(0, 50, (2, 6)).astype(np.int32)
    bert(bert_ids)
    bert.save_pretrained(out / "tf_bert")
    (out / "tf_bert" / "config.json").unlink()
    np.savez(out / "tf_bert_io.npz", ids=bert_ids,
             y=bert(bert_ids, training=False).last_hidden_state.numpy())
    _record("keras", sorted(str(p.relative_to(OUT)) for p in out.rglob("*") if p.is_file()),
            "keras 3 functional models (seeded, variables randomised) saved with model.save and "
            "save_weights; a tf_keras Sequential with save_weights('.h5'); transformers "
            "TFBertModel.save_pretrained (tf_model.h5); *_io.npz: the framework's outputs",
            ["tensorflow-cpu", "keras", "tf-keras", "transformers", "h5py", "numpy"])


def make_keras_full() -> None:
    """A tf.keras (Keras 2) model saved whole by model.save('.h5').

    The weights are under ``model_weights``, the architecture beside them (never read by
    torchgraft).
    """
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    out = OUT / "keras"
    rng = np.random.default_rng(1)
    model = _legacy_cnn(1, rng)
    model.save(str(out / "legacy_full.h5"))
    image = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
    np.savez(out / "legacy_full_io.npz", x=image, y=model(image, training=False).numpy())
    _record("keras/legacy_full", ["keras/legacy_full.h5", "keras/legacy_full_io.npz"],
            "a tf_keras Sequential (seed 1, variables randomised) saved whole with "
            "model.save('.h5'); legacy_full_io.npz: its outputs",
            ["tensorflow-cpu", "tf-keras", "h5py", "numpy"])


def _lying_config(archive: Path, out: Path, names: tuple[str, str]) -> None:
    """A copy of a ``.keras`` archive whose config.json lists two layers in exchanged places.

    The weights file is Keras' own, byte for byte: only the config lies about the order.
    """
    import zipfile

    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(out, "w") as copy:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "config.json":
                config = json.loads(data)
                layers = config["config"]["layers"]
                at = [k for k, layer in enumerate(layers)
                      if layer["config"].get("name") in names]
                layers[at[0]], layers[at[1]] = layers[at[1]], layers[at[0]]
                data = json.dumps(config).encode()
            copy.writestr(info, data)


def make_keras_siblings() -> None:
    """Keras 3 models whose same-shape layers only their order tells apart, by Keras itself.

    siblings: a Sequential of Dense layers (three of one shape) named against their order
    (``zeta``, ``alpha``, ``mid``, ``head``), saved with model.save (.keras: its config lists
    the layers in order) and save_weights (.weights.h5: no config); siblings_lying.keras: the
    same archive with the config listing ``zeta`` and ``alpha`` exchanged. encoder: a flat
    functional pre-norm transformer (Embedding, two blocks of LayerNormalization,
    MultiHeadAttention, LayerNormalization, two Dense; a final LayerNormalization and Dense),
    Keras' default names. tf_resnet: transformers' TFResNetModel (basic blocks) by
    save_pretrained, its config.json removed (a bare file). Outputs beside each.
    """
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    from transformers import ResNetConfig, TFResNetModel

    out = OUT / "keras"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2)
    layers = keras.layers
    keras.backend.clear_session()
    keras.utils.set_random_seed(2)
    siblings = keras.Sequential([
        keras.Input((8,)), layers.Dense(8, activation="relu", name="zeta"),
        layers.Dense(8, activation="relu", name="alpha"),
        layers.Dense(8, activation="relu", name="mid"), layers.Dense(3, name="head")])
    _randomise_keras(siblings, rng)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    siblings.save(out / "siblings.keras")
    siblings.save_weights(out / "siblings.weights.h5")
    _lying_config(out / "siblings.keras", out / "siblings_lying.keras", ("zeta", "alpha"))
    np.savez(out / "siblings_io.npz", x=x, y=np.asarray(siblings(x)))

    keras.backend.clear_session()
    width, vocab, length = 8, 12, 5
    ids = keras.Input((length,), dtype="int32")
    h = layers.Embedding(vocab, width)(ids)
    for _ in range(2):
        a = layers.LayerNormalization()(h)
        h = layers.Add()([h, layers.MultiHeadAttention(2, width // 2)(a, a)])
        m = layers.LayerNormalization()(h)
        m = layers.Dense(2 * width, activation="gelu")(m)
        h = layers.Add()([h, layers.Dense(width)(m)])
    encoder = keras.Model(ids, layers.Dense(vocab)(layers.LayerNormalization()(h)))
    _randomise_keras(encoder, rng)
    tokens = rng.integers(0, vocab, (2, length)).astype(np.int32)
    encoder.save(out / "encoder.keras")
    encoder.save_weights(out / "encoder.weights.h5")
    np.savez(out / "encoder_io.npz", ids=tokens, y=np.asarray(encoder(tokens)))

    config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16],
                          depths=[2, 1], layer_type="basic", downsample_in_first_stage=False)
    resnet = TFResNetModel(config)
    image = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    resnet(image)
    _randomise_keras(resnet, rng)
    resnet.save_pretrained(out / "tf_resnet")
    (out / "tf_resnet" / "config.json").unlink()
    np.savez(out / "tf_resnet_io.npz", x=image,
             y=resnet(image, training=False).pooler_output.numpy())
    files = ["siblings.keras", "siblings.weights.h5", "siblings_lying.keras", "siblings_io.npz",
             "encoder.keras", "encoder.weights.h5", "encoder_io.npz", "tf_resnet/tf_model.h5",
             "tf_resnet_io.npz"]
    _record("keras/siblings", [f"keras/{name}" for name in files],
            "keras 3 models of same-shape layers (seed 2, variables randomised): a Sequential "
            "named against its order saved with model.save and save_weights, and a copy of its "
            ".keras whose config.json lists two of them exchanged (siblings_lying); a flat "
            "functional pre-norm transformer the same way; transformers TFResNetModel.save_"
            "pretrained (tf_model.h5, its config.json removed); *_io.npz: the framework's "
            "outputs",
            ["tensorflow-cpu", "keras", "transformers", "h5py", "numpy"])


# --- Flax -----------------------------------------------------------------------------------

def _flax_cases(rng: np.random.Generator) -> dict[str, tuple[Any, np.ndarray]]:
    """The linen test models (tests/io/test_flax.py's twins), each with its input."""
    import flax.linen as nn

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.Conv(4, (3, 3), padding="VALID")(x)
            x = nn.BatchNorm(use_running_average=True)(x)
            x = nn.relu(x).mean((1, 2))
            x = nn.LayerNorm()(nn.Dense(6)(x))
            return nn.Dense(3)(x)

    class Attention(nn.Module):
        @nn.compact
        def __call__(self, ids: Any) -> Any:
            x = nn.Embed(10, 8, name="embed")(ids)
            x = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8, name="attn")(x, x)
            return nn.Dense(3, name="head")(x)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any, _: Any) -> tuple[Any, None]:
            return x + nn.relu(nn.Dense(8, name="fc")(nn.LayerNorm(name="norm")(x))), None

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.Dense(8, name="inp")(x)
            blocks = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                             length=3)
            x, _ = blocks(name="blocks")(x, None)
            return nn.Dense(2, name="out")(x)

    return {
        "cnn": (CNN(), rng.standard_normal((2, 8, 8, 3)).astype(np.float32)),
        "attention": (Attention(), rng.integers(0, 10, (2, 5)).astype(np.int32)),
        "scan": (Stack(), rng.standard_normal((2, 4)).astype(np.float32)),
    }


def _flax_variables(module: Any, x: np.ndarray, rng: np.random.Generator) -> Any:
    """A linen module's variables, every one random (variances positive)."""
    import jax
    import jax.numpy as jnp

    def one(path: Any, leaf: Any) -> Any:
        value = rng.standard_normal(leaf.shape).astype(np.float32) * 0.5
        if "var" in str(path[-1]):
            value = np.abs(value) + 0.5
        return jnp.asarray(value)

    return jax.tree_util.tree_map_with_path(one, module.init(jax.random.PRNGKey(0), x))


def make_flax() -> None:
    """Flax linen models and transformers' FlaxBertModel, saved by Flax's own functions.

    flax.serialization.to_bytes for the linen models, save_pretrained (flax_model.msgpack) for
    FlaxBertModel; outputs for fixed inputs beside each.
    """
    from flax import serialization

    out = OUT / "flax"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, (module, x) in _flax_cases(rng).items():
        variables = _flax_variables(module, x, rng)
        (out / f"{name}.msgpack").write_bytes(serialization.to_bytes(variables))
        np.savez(out / f"{name}_io.npz", x=x, y=np.asarray(module.apply(variables, x)))

    from transformers import BertConfig, FlaxBertModel
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=16)
    bert = FlaxBertModel(config, seed=0)
    ids = rng.integers(0, 50, (2, 6)).astype(np.int32)
    bert.save_pretrained(out / "flax_bert")
    (out / "flax_bert" / "config.json").unlink()
    np.savez(out / "flax_bert_io.npz", ids=ids, y=np.asarray(bert(ids).last_hidden_state))
    _record("flax", sorted(str(p.relative_to(OUT)) for p in out.rglob("*") if p.is_file()),
            "flax linen models (variables randomised, seed 0; one with nn.scan-stacked layers) "
            "saved with flax.serialization.to_bytes; transformers FlaxBertModel.save_pretrained "
            "(flax_model.msgpack); *_io.npz: the framework's outputs",
            ["jax", "flax", "transformers", "numpy"])



def make_flax_bf16() -> None:
    """The linen CNN with bfloat16 variables, saved by flax.serialization.to_bytes.

    Its outputs are Flax's, with those bfloat16 values computed in float32.
    """
    import jax
    import jax.numpy as jnp
    from flax import serialization

    out = OUT / "flax"
    rng = np.random.default_rng(1)
    module, x = _flax_cases(rng)["cnn"]
    variables = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16),
                                       _flax_variables(module, x, rng))
    (out / "cnn_bf16.msgpack").write_bytes(serialization.to_bytes(variables))
    widened = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), variables)
    np.savez(out / "cnn_bf16_io.npz", x=x, y=np.asarray(module.apply(widened, x)))
    _record("flax/cnn_bf16", ["flax/cnn_bf16.msgpack", "flax/cnn_bf16_io.npz"],
            "the flax linen CNN (variables randomised, seed 1) cast to bfloat16 and saved with "
            "flax.serialization.to_bytes; y: Flax's outputs with those values in float32",
            ["jax", "flax", "numpy"])

# --- Orbax ---------------------------------------------------------------------------------

def _nnx_net() -> Any:
    """A Flax NNX model (tests/io/test_orbax.py's NnxNet): Conv, BatchNorm, Linear list, head."""
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.conv = nnx.Conv(3, 4, (3, 3), padding="VALID", rngs=rngs)
            self.bn = nnx.BatchNorm(4, use_running_average=True, rngs=rngs)
            self.blocks = nnx.List([nnx.Linear(4, 4, rngs=rngs) for _ in range(2)])
            self.norm = nnx.LayerNorm(4, rngs=rngs)
            self.head = nnx.Linear(4, 3, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            x = nnx.relu(self.bn(self.conv(x))).mean((1, 2))
            for block in self.blocks:
                x = x + nnx.relu(block(x))
            return self.head(self.norm(x))

    return Net(nnx.Rngs(0))


def make_orbax() -> None:
    """Orbax checkpoint folders of Flax models, written by orbax-checkpoint itself.

    The linen models of make_flax (new random values) in the three storage layouts Orbax
    writes: OCDBT with zarr v2 chunks (StandardCheckpointer, the default), OCDBT with zarr v3
    (use_zarr3=True) and one zarr v2 folder per array (use_ocdbt=False); and a Flax NNX model
    saved by a CheckpointManager (step 7, item "state"). Outputs for fixed inputs beside each.
    """
    import shutil

    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from flax import nnx

    out = OUT / "orbax"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng = np.random.default_rng(2)
    writers = {"cnn": lambda: ocp.StandardCheckpointer(),
               "scan": lambda: ocp.PyTreeCheckpointer(use_zarr3=True),
               "attention": lambda: ocp.PyTreeCheckpointer(use_ocdbt=False)}
    for name, (module, x) in _flax_cases(rng).items():
        variables = _flax_variables(module, x, rng)
        writer = writers[name]()
        if isinstance(writer, ocp.StandardCheckpointer):
            writer.save(out / name, variables)
        else:
            writer.save(out / name, args=ocp.args.PyTreeSave(variables))
        writer.close()
        np.savez(out / f"{name}_io.npz", x=x, y=np.asarray(module.apply(variables, x)))

    net = _nnx_net()
    graph, state = nnx.split(net)
    state = jax.tree_util.tree_map(
        lambda leaf: jnp.asarray(np.abs(rng.standard_normal(leaf.shape)).astype(np.float32)
                                 + 0.5), state)
    net = nnx.merge(graph, state)
    manager = ocp.CheckpointManager(out / "nnx")
    manager.save(7, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    manager.wait_until_finished()
    manager.close()
    image = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
    np.savez(out / "nnx_io.npz", x=image, y=np.asarray(net(jnp.asarray(image))))
    _record("orbax", sorted(str(p.relative_to(OUT)) for p in out.rglob("*") if p.is_file()),
            "make_flax's linen models (seed 2) saved by orbax-checkpoint: cnn with "
            "StandardCheckpointer (OCDBT, zarr v2), scan with use_zarr3=True (OCDBT, zarr v3), "
            "attention with use_ocdbt=False (a zarr v2 folder per array); nnx: a Flax NNX model "
            "saved by CheckpointManager (step 7, item 'state'); *_io.npz: the framework's outputs",
            ["jax", "flax", "orbax-checkpoint", "tensorstore", "numpy"])


# --- MLX ------------------------------------------------------------------------------------

#: The tiny mlx-lm Llama both MLX fixtures are written from.
_MLX_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-6, "vocab_size": 64, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "max_position_embeddings": 64}


def make_mlx() -> None:
    """An mlx-lm quantized Llama and an MLX CNN, saved by MLX's own functions.

    The Llama is quantized by mlx_lm.utils.quantize_model (4 bits, groups of 32) and saved by
    save_model/save_config; the CNN by save_weights (.safetensors, .npz).
    """
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import llama
    from mlx_lm.utils import quantize_model, save_config, save_model

    out = OUT / "mlx"
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    config = dict(_MLX_LLAMA)  # quantize_model adds its settings to the dict
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    ids = mx.array([[1, 5, 9, 2, 33, 60, 7, 12]])
    float_logits = np.array(model(ids))
    model, quantized_config = quantize_model(model, config, group_size=32, bits=4)
    logits = np.array(model(ids))
    layer = model.model.layers[0].self_attn.q_proj
    dequantized = np.array(mx.dequantize(layer.weight, layer.scales, layer.biases,
                                         group_size=32, bits=4))
    save_model(out / "llama_q4", model)
    save_config(quantized_config, out / "llama_q4" / "config.json")
    np.savez(out / "llama_q4_io.npz", ids=np.array(ids), logits=logits,
             float_logits=float_logits, q_proj_0=dequantized)

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
            self.fc = nn.Linear(6, 3)

        def __call__(self, x: Any) -> Any:
            return self.fc(nn.relu(self.conv2(nn.relu(self.conv(x)))).mean(axis=(1, 2)))

    cnn = CNN()
    mx.eval(cnn.parameters())
    x = mx.random.normal((2, 8, 8, 3))
    cnn.save_weights(str(out / "cnn.safetensors"))
    cnn.save_weights(str(out / "cnn.npz"))
    np.savez(out / "cnn_io.npz", x=np.array(x), y=np.array(cnn(x)))
    _record("mlx", sorted(str(p.relative_to(OUT)) for p in out.rglob("*") if p.is_file()),
            "mlx-lm llama.Model (mx.random.seed 0) quantized by mlx_lm.utils.quantize_model "
            "(affine, 4 bits, group 32) and saved by save_model/save_config; logits: the "
            "quantized MLX model's, float_logits: before quantization, q_proj_0: "
            "mx.dequantize of layer 0's q_proj; an MLX CNN saved by save_weights",
            ["mlx", "mlx-lm", "numpy"])


#: mlx-whisper's model dimensions for the held-out fixture: those of the held-out suite's narrow
#: Whisper models (tests/graft/pairs/heldout_codebases.py), whose outputs are compared there.
_MLX_WHISPER = {"n_mels": 16, "n_audio_ctx": 8, "n_audio_state": 32, "n_audio_head": 4,
                "n_audio_layer": 2, "n_vocab": 96, "n_text_ctx": 12, "n_text_state": 32,
                "n_text_head": 4, "n_text_layer": 2}


def _mlx_whisper_module() -> Any:
    """mlx_whisper.whisper without the package's __init__ (transcription: numba, scipy, torch)."""
    import importlib
    import importlib.util
    import types

    spec = importlib.util.find_spec("mlx_whisper")
    assert spec is not None and spec.submodule_search_locations is not None
    package = types.ModuleType("mlx_whisper")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules.setdefault("mlx_whisper", package)
    return importlib.import_module("mlx_whisper.whisper")


def _randomise_mlx(model: Any, rng: np.random.Generator) -> None:
    """Random floats everywhere, norms' scales away from 0 and 1 (as the torch tests do)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    new = []
    for name, value in tree_flatten(model.parameters()):
        if value.dtype != mx.float32:
            continue  # alignment_heads: indices
        norm = name.endswith("ln.weight") or name.endswith("ln_post.weight")
        array = rng.random(value.shape) + 0.5 if norm else rng.standard_normal(value.shape) * 0.1
        new.append((name, mx.array(array.astype(np.float32))))
    model.update(tree_unflatten(new))


def make_mlx_whisper() -> None:
    """mlx-whisper's Whisper and two broken twins, saved by MLX's save_weights.

    The held-out suite's MLX file: plain safetensors, no marker, convolutions channels last,
    tensors in hash order. whisper.safetensors: the model (seed 0); whisper_deeper: one more
    block in the encoder and the decoder; whisper_norms: encoder block 0's two norms swapped.
    whisper_io.npz: the inputs (mel as PyTorch's [batch, mels, frames], tokens) and the
    unbroken model's logits.
    """
    import mlx.core as mx

    whisper = _mlx_whisper_module()
    out = OUT / "mlx"
    out.mkdir(parents=True, exist_ok=True)

    def build(deeper: bool = False) -> Any:
        dims = dict(_MLX_WHISPER)
        if deeper:
            dims["n_audio_layer"] += 1
            dims["n_text_layer"] += 1
        model = whisper.Whisper(whisper.ModelDimensions(**dims), mx.float32)
        _randomise_mlx(model, np.random.default_rng(0))
        return model

    model = build()
    rng = np.random.default_rng(1)
    mel = rng.standard_normal((2, 16, 16)).astype(np.float32)  # [batch, frames, mels]
    tokens = rng.integers(3, 95, (2, 12))
    logits = np.array(model(mx.array(mel), mx.array(tokens)))
    model.save_weights(str(out / "whisper.safetensors"))
    build(deeper=True).save_weights(str(out / "whisper_deeper.safetensors"))
    block = model.encoder.blocks[0]
    block.attn_ln, block.mlp_ln = block.mlp_ln, block.attn_ln
    model.save_weights(str(out / "whisper_norms.safetensors"))
    np.savez(out / "whisper_io.npz", mel=mel.transpose(0, 2, 1), tokens=tokens, logits=logits)
    _record("mlx/whisper", sorted(f"mlx/{name}" for name in (
        "whisper.safetensors", "whisper_deeper.safetensors", "whisper_norms.safetensors",
        "whisper_io.npz")),
            "mlx-whisper whisper.Whisper (float32, parameters randomised with numpy seed 0) "
            "saved by save_weights; a deeper twin and one with encoder block 0's norms "
            "swapped, the same way; logits: the unbroken model's for mel and tokens",
            ["mlx", "mlx-whisper", "numpy"])


def make_mlx_convs() -> None:
    """MLX models with convolutions only their shapes tell the layout of, by save_weights.

    convs_ambiguous: one Conv2d(3, 16, 3) (``[16, 3, 3, 3]`` reads the same both ways), a
    LayerNorm and two Linear layers; convs_transposed: a Conv1d and a ConvTranspose1d;
    convs_transposed2d: a Conv2d(3, 6, 3) (either way) and a ConvTranspose2d (channels last
    only: it shows the file's layout). Parameters random (numpy seed 3); outputs for
    channels-last inputs beside.
    """
    import mlx.core as mx
    import mlx.nn as nn

    out = OUT / "mlx"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)

    class Ambiguous(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3)
            self.norm = nn.LayerNorm(16)
            self.fc1 = nn.Linear(16, 16)
            self.fc2 = nn.Linear(16, 3)

        def __call__(self, x: Any) -> Any:
            x = self.norm(nn.relu(self.stem(x)).mean(axis=(1, 2)))
            return self.fc2(nn.relu(self.fc1(x)))

    class Transposed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Conv1d(4, 8, 3, padding=1)
            self.dec = nn.ConvTranspose1d(8, 4, 4, stride=2, padding=1)

        def __call__(self, x: Any) -> Any:
            return self.dec(nn.relu(self.enc(x)))

    class Transposed2d(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Conv2d(3, 6, 3, padding=1)
            self.up = nn.ConvTranspose2d(6, 5, 2, stride=2)

        def __call__(self, x: Any) -> Any:
            return self.up(nn.relu(self.enc(x)))

    cases = {"convs_ambiguous": (Ambiguous(), (2, 8, 8, 3)),
             "convs_transposed": (Transposed(), (2, 10, 4)),
             "convs_transposed2d": (Transposed2d(), (2, 6, 6, 3))}
    for name, (model, shape) in cases.items():
        _randomise_mlx(model, rng)
        x = mx.array(rng.standard_normal(shape).astype(np.float32))
        model.save_weights(str(out / f"{name}.safetensors"))
        np.savez(out / f"{name}_io.npz", x=np.array(x), y=np.array(model(x)))
    _record("mlx/convs", sorted(f"mlx/{name}{end}" for name in cases
                                for end in (".safetensors", "_io.npz")),
            "MLX models (parameters randomised with numpy seed 3) saved by save_weights: a "
            "Conv2d(3, 16, 3), a LayerNorm and two Linear; a Conv1d and a ConvTranspose1d; a "
            "Conv2d(3, 6, 3) and a ConvTranspose2d; x: channels-last inputs, y: MLX's outputs",
            ["mlx", "numpy"])


#: mlx-lm's per-module quantization for the modes fixture: every mode MLX has, and affine
#: widths that do not divide a byte; the rest of the model gets the default (mxfp4).
_MLX_MODES = {"model.embed_tokens": {"group_size": 32, "bits": 3, "mode": "affine"},
              "model.layers.0.mlp": {"group_size": 16, "bits": 4, "mode": "nvfp4"},
              "model.layers.1.mlp": {"group_size": 32, "bits": 8, "mode": "mxfp8"},
              "model.layers.1.self_attn.o_proj": {"group_size": 64, "bits": 6,
                                                  "mode": "affine"},
              "lm_head": {"group_size": 32, "bits": 5, "mode": "affine"}}
#: One module per mode whose mx.dequantize goes into the fixture (all of them: 350 KB).
_MLX_CHECKED = ("model.embed_tokens", "model.layers.0.self_attn.q_proj",
                "model.layers.0.mlp.gate_proj", "model.layers.1.mlp.up_proj",
                "model.layers.1.self_attn.o_proj", "lm_head")


def make_mlx_modes() -> None:
    """An mlx-lm Llama quantized in every MLX mode, saved by mlx-lm.

    mxfp4 by default; nvfp4, mxfp8 and 3-, 5- and 6-bit affine per module, which mlx-lm writes
    as per-module entries of the config's ``quantization``.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from mlx_lm.utils import quantize_model, save_config, save_model

    out = OUT / "mlx"
    mx.random.seed(1)
    config = dict(_MLX_LLAMA)  # quantize_model adds its settings to the dict
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    ids = mx.array([[1, 5, 9, 2, 33, 60, 7, 12]])

    def predicate(path: str, _: Any) -> bool | dict[str, Any]:
        return next((dict(v) for k, v in _MLX_MODES.items()
                     if path == k or path.startswith(k + ".")), True)

    model, quantized_config = quantize_model(model, config, group_size=None, bits=None,
                                             mode="mxfp4", quant_predicate=predicate)
    logits = np.array(model(ids).astype(mx.float32))
    dequantized = {}
    for name, module in tree_flatten(model.leaf_modules(), is_leaf=lambda m: hasattr(
            m, "scales")):
        if name not in _MLX_CHECKED:
            continue
        weight = mx.dequantize(module.weight, module.scales, getattr(module, "biases", None),
                               group_size=module.group_size, bits=module.bits,
                               mode=module.mode)
        dequantized[f"{name}.weight"] = np.array(weight.astype(mx.float32))
        dequantized[f"{name}.dtype"] = np.array(str(weight.dtype))
    save_model(out / "llama_modes", model)
    save_config(quantized_config, out / "llama_modes" / "config.json")
    np.savez_compressed(out / "llama_modes_io.npz", ids=np.array(ids), logits=logits,
                        **dequantized)
    files = [*sorted(str(p.relative_to(OUT)) for p in (out / "llama_modes").iterdir()),
             "mlx/llama_modes_io.npz"]
    _record("mlx/llama_modes", files,
            "mlx-lm llama.Model (mx.random.seed 1) quantized by mlx_lm.utils.quantize_model in "
            "mode mxfp4, with per-module entries (quant_predicate) for nvfp4, mxfp8 and 3-, 5- "
            "and 6-bit affine, saved by save_model/save_config; logits: the quantized MLX "
            "model's; '<module>.weight': mx.dequantize of one module per mode (as float32, "
            "'<module>.dtype' the dtype mx.dequantize gave)",
            ["mlx", "mlx-lm", "numpy"])


COMMANDS: dict[str, Callable[[], Any]] = {"gguf": make_gguf, "gguf-qwen2": make_gguf_qwen2,
                                          "gguf-qwen2-bf16": lambda: make_gguf_qwen2("bf16"),
                                          "keras": make_keras, "keras-full": make_keras_full,
                                          "keras-siblings": make_keras_siblings,
                                          "flax": make_flax, "flax-bf16": make_flax_bf16,
                                          "orbax": make_orbax,
                                          "mlx": make_mlx, "mlx-modes": make_mlx_modes,
                                          "mlx-convs": make_mlx_convs,
                                          "mlx-whisper": make_mlx_whisper}

if __name__ == "__main__":
    for command in sys.argv[1:] or list(COMMANDS):
        COMMANDS[command]()
