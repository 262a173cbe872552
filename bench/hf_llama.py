"""A transformers Llama from its own sharded folder: ``from_pretrained`` vs meta + ``tg.graft``.

Target (issue 28): building ``LlamaForCausalLM`` on the meta device and ``tg.graft(folder,
model)`` at most 1.0x the wall time and 1.0x the peak RSS of
``LlamaForCausalLM.from_pretrained(folder)``. The folder is ``save_pretrained``'s own, about
1 GiB of float32 weights in shards (``max_shard_size``); both sides end with a model that runs:
the clock runs from reading the config until every weight has been read once (a checksum,
which must agree between the sides: both memory-map the shards, and a weight mapped but never
read has cost nothing yet), then each side runs the same tokens (outside the clock) and the
logits must agree between the sides. The time to the model built and filled, before the
checksum, is shown too. The graft's
non-persistent buffers (rotary frequencies) are computed by the model's own code
(``report.initialised``). Each side: fresh process, page cache warmed first, both sides import
torch, transformers and torchgraft before the clock, sides alternating; the time ratio is the
median of the per-pair ratios, peak RSS the median of each side's high-water marks.

Run: python bench/hf_llama.py [--layers 18] [--repeat 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/inspect.py would shadow the standard library's inspect (imported by torch): bench/
# goes last on the path, after the standard library.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(_HERE)] + [_HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from harness import median_of, pair_ratios, peak_rss, warm, worker  # noqa: E402

METHODS = ("from_pretrained", "torchgraft")


def _config(layers: int) -> Any:
    import transformers

    return transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                    num_hidden_layers=layers, num_attention_heads=16,
                                    num_key_value_heads=4, tie_word_embeddings=False)


def _read_all(model: Any) -> float:
    """Every weight read once (a float32 sum each: no temporary copy of a weight, unlike a
    float64 one, whose 250 MiB for the embedding would decide the peak RSS by chance)."""
    return sum(float(p.detach().sum()) for p in model.parameters())


def make(folder: Path, layers: int) -> dict[str, Any]:
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config(layers))
    model.save_pretrained(folder, max_shard_size="300MB")
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return {"bytes": size, "shards": len(list(folder.glob("*.safetensors")))}


def load(method: str, folder: Path) -> dict[str, Any]:
    import torch
    import transformers

    import torchgraft as tg

    graft, cls = tg.graft, transformers.LlamaForCausalLM  # imported before the clock
    start = time.perf_counter()
    if method == "from_pretrained":
        model = cls.from_pretrained(folder)
        initialised = 0
    else:
        config = cls.config_class.from_pretrained(folder)  # as from_pretrained reads it
        with torch.device("meta"):
            model = cls(config)
        report = graft(folder, model)
        assert report.ok, str(report)
        initialised = len(report.initialised)
    loaded = time.perf_counter() - start
    total = _read_all(model)  # every weight read once: a memory-mapped one is read here
    seconds = time.perf_counter() - start
    tokens = torch.arange(16).reshape(1, 16) * 97 % 32000
    with torch.no_grad():
        logits = model.eval()(input_ids=tokens).logits
    return {"seconds": seconds, "loaded": loaded, "peak_rss": peak_rss(),
            "initialised": initialised, "checksum": total,
            "logits": float(logits.double().sum()), "first": float(logits[0, -1, 0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=18)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "FOLDER"))
    args = parser.parse_args()
    if args.worker:
        method, folder = args.worker
        out = make(Path(folder), args.layers) if method == "make" else load(method,
                                                                            Path(folder))
        print(json.dumps(out))
        return
    with tempfile.TemporaryDirectory(dir=_HERE) as tmp:
        folder = Path(tmp)
        made = worker(__file__, "make", str(folder), "--layers", str(args.layers))
        print(f"folder: {made['bytes'] / 2**30:.2f} GiB in {made['shards']} shards; "
              f"load average {os.getloadavg()}")
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
        for _ in range(args.repeat):
            for method in METHODS:
                warm(folder)
                runs[method].append(worker(__file__, method, str(folder)))
    outputs = {m: {(r["checksum"], r["logits"], r["first"]) for r in rs}
               for m, rs in runs.items()}
    assert len(outputs["from_pretrained"]) == 1, outputs
    assert outputs["from_pretrained"] == outputs["torchgraft"], outputs
    result = {m: median_of(rs, "seconds", "loaded", "peak_rss") for m, rs in runs.items()}
    gib = 2**30
    for label, method in (("LlamaForCausalLM.from_pretrained(folder)", "from_pretrained"),
                          ("meta + tg.graft(folder, model)", "torchgraft")):
        r = result[method]
        print(f"{label:<42} {r['seconds']:6.3f} s (filled at {r['loaded']:.3f} s)  "
              f"peak RSS {r['peak_rss'] / gib:5.2f} GiB")
    print(f"keys initialised by the model's code: {runs['torchgraft'][0]['initialised']}; "
          "logits agree")
    ratio = pair_ratios(runs["torchgraft"], runs["from_pretrained"])
    rss = result["torchgraft"]["peak_rss"] / result["from_pretrained"]["peak_rss"]
    met = ratio <= 1.0 and rss <= 1.0
    print(f"time ratio {ratio:.2f} (median of pairs, target <= 1.0), peak RSS ratio {rss:.2f} "
          f"(<= 1.0): {'met' if met else 'NOT met'}; load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
