r"""Check that transformers 4.x loads the Hub-layout files torchgraft writes from transformers 5.

transformers 5 holds a mixture-of-experts layer as fused 3-D parameters; transformers 4.x
holds one module per expert and reads the Hub's per-expert names. This script builds tiny
MoE models with transformers 5 (this interpreter), writes each one twice, with
``tg.save(model, ..., experts=LAYOUT)`` and with ``tg.convert(fused.pt, ..., experts=LAYOUT)``
(plus ``config.save_pretrained``), then runs ``from_pretrained`` on every folder in a second
interpreter that has transformers 4.x and compares its logits with transformers 5's, bit for
bit. It fails (exit 1) unless every folder loads with no missing or unexpected key and equal
logits.

The second interpreter is a venv that reuses this one's torch through a ``.pth`` file, so
transformers 4.x never enters the shared environment::

    python -m venv /work/venvs/tf4
    /work/venvs/tf4/bin/pip install "transformers==4.57.*"   # before the .pth: pip then
    echo /work/main/.venv/lib/python3.11/site-packages \
        > /work/venvs/tf4/lib/python3.11/site-packages/zz_shared.pth   # sees no torch
    PYTHONPATH=src python scripts/check_older_transformers.py --python /work/venvs/tf4/bin/python

CI cannot run it (it needs the second environment); the result is recorded in the notes.
Random weights only; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TINY = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2}
#: model type: (model class, MoE options, the ``experts=`` layout transformers 4.x reads).
#: GPT-OSS is fused in transformers 4.x too: its files keep the stacked names (no option).
MOE: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "mixtral": ("MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2},
                "mixtral"),
    "qwen3_moe": ("Qwen3MoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2,
                                          "moe_intermediate_size": 12, "head_dim": 8},
                  "per-expert"),
    "qwen2_moe": ("Qwen2MoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2,
                                          "moe_intermediate_size": 12,
                                          "shared_expert_intermediate_size": 20},
                  "per-expert"),
    "olmoe": ("OlmoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2}, "per-expert"),
    "deepseek_v3": ("DeepseekV3ForCausalLM", {
        "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
        "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 8, "q_lora_rank": 8,
        "qk_rope_head_dim": 4, "qk_nope_head_dim": 4, "v_head_dim": 8, "n_group": 1,
        "topk_group": 1}, "per-expert"),
    "gpt_oss": ("GptOssForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                      "head_dim": 8,
                                      "layer_types": ["full_attention", "full_attention"]},
                None),
}
TOKENS = [[1, 5, 9, 13, 2, 7]]


def write(folder: Path) -> list[dict[str, Any]]:
    """Build each model with transformers 5 and write its two folders and its logits."""
    import torch
    import transformers
    from safetensors.torch import save_file

    import torchgraft as tg

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    cases = []
    for model_type, (cls, options, layout) in MOE.items():
        config = transformers.AutoConfig.for_model(model_type, **TINY, **options)
        torch.manual_seed(0)
        model = getattr(transformers, cls)(config).eval()
        with torch.no_grad():
            logits = model(torch.tensor(TOKENS)).logits
        saved, converted = folder / model_type / "save", folder / model_type / "convert"
        for out in (saved, converted):
            model.config.save_pretrained(out)
        tg.save(model, saved / "model.safetensors", experts=layout)
        fused = folder / model_type / "fused.pt"
        torch.save(model.state_dict(), fused)
        tg.convert(fused, converted / "model.safetensors", experts=layout)
        save_file({"logits": logits}, folder / model_type / "logits.safetensors")
        model.save_pretrained(folder / model_type / "hub")  # transformers 5's own writer
        for how, out in (("tg.save", saved), ("tg.convert", converted)):
            cases.append({"model": model_type, "how": how, "experts": layout,
                          "folder": str(out), "hub": str(folder / model_type / "hub"),
                          "logits": str(folder / model_type / "logits.safetensors")})
    return cases


def load(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """In transformers 4.x: ``from_pretrained`` each folder; compare with transformers 5.

    The config is built by transformers 4.x from the same options (transformers 5's
    ``config.json`` renames some fields, e.g. Qwen3-MoE's ``num_experts``, which 4.x then
    misses, whoever wrote the weights). The weights of our folder must equal, bit for bit,
    those 4.x loads from transformers 5's own ``save_pretrained`` folder, and so must the
    logits; the logits are also compared with transformers 5's (4.x computes experts in
    another order, so those may differ in the last bits).
    """
    import torch
    import transformers
    from safetensors.torch import load_file

    def loaded(folder: str, config: Any) -> tuple[Any, dict[str, list[str]], torch.Tensor]:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            folder, config=config, output_loading_info=True)
        with torch.no_grad():
            logits = model.eval()(torch.tensor(TOKENS)).logits
        return model, {k: sorted(map(str, v)) for k, v in info.items() if v}, logits

    results = []
    for case in cases:
        _cls, options, _layout = MOE[case["model"]]
        config = transformers.AutoConfig.for_model(case["model"], **TINY, **options)
        found: dict[str, Any] = {"transformers": transformers.__version__}
        try:
            model, problems, logits = loaded(case["folder"], config)
            hub, _, hub_logits = loaded(case["hub"], config)
        except Exception as error:  # reported, and the run fails
            results.append(case | found | {"class": "-", "error": repr(error)[:300]})
            continue
        theirs = hub.state_dict()
        expected = load_file(case["logits"])["logits"]
        results.append(case | found | {
            "class": type(model).__name__, "loading_problems": problems,
            "weights_equal": all(torch.equal(v, theirs[k])
                                 for k, v in model.state_dict().items()),
            "equal_to_hub_folder": bool(torch.equal(logits, hub_logits)),
            "difference_to_v5": float((logits - expected).abs().max())})
    return results


def main() -> int:
    """Write with this transformers, load with the other; print one line per folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="/work/venvs/tf4/bin/python",
                        help="an interpreter with transformers 4.x and torch")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(load(json.loads(Path(args.worker).read_text()))))
        return 0
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        cases = write(Path(tmp))
        listing = Path(tmp) / "cases.json"
        listing.write_text(json.dumps(cases))
        out = subprocess.run([args.python, __file__, "--worker", str(listing)],
                             capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-4000:], file=sys.stderr)
            return 1
        results = json.loads(out.stdout.strip().splitlines()[-1])
    failed = 0
    print(f"written with transformers {transformers.__version__}, loaded with "
          f"transformers {results[0]['transformers']}")
    for r in results:
        good = "error" not in r and not r["loading_problems"] and r["weights_equal"] and \
            r["equal_to_hub_folder"] and r["difference_to_v5"] <= 1e-5
        failed += not good
        said = r.get("error") or (
            f"weights {'equal' if r['weights_equal'] else 'DIFFER'}, logits "
            f"{'equal' if r['equal_to_hub_folder'] else 'NOT equal'} to save_pretrained's "
            f"folder, max |diff| to transformers 5 {r['difference_to_v5']:.1e}"
            + (f"; {r['loading_problems']}" if r["loading_problems"] else ""))
        print(f"{'ok  ' if good else 'FAIL'} {r['model']:<12} {r['how']:<10} "
              f"experts={r['experts']!s:<10} -> {r['class']}: {said}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
