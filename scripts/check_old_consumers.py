r"""Check that safetensors files torchgraft writes load in older transformers and huggingface_hub.

The test suite runs the newest releases; people still run transformers 4.x (this project's
``hf`` extra allows ``>=4.40``) and huggingface_hub 0.x, whose loaders refuse files without
``format: pt`` metadata. Run by hand in an environment with the old releases::

    python -m venv /tmp/old && /tmp/old/bin/pip install torch==2.13.0 "transformers==4.46.3" \\
        "huggingface_hub<1" click rich && /tmp/old/bin/pip install --no-deps -e .
    /tmp/old/bin/python scripts/check_old_consumers.py

It writes a GPT-2 with ``tg.save`` (one file, then shards) and with ``tg.convert`` from a torch
file, loads each with ``from_pretrained`` and ``load_state_dict_from_file``, and exits 1 unless
every weight comes back bit for bit.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import huggingface_hub
import torch
import transformers

import torchgraft as tg


def main() -> int:
    """Write, load with the old consumers, compare; print one line per case."""
    work = Path(tempfile.mkdtemp())
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100,
                                     n_positions=16)
    torch.manual_seed(0)
    source = transformers.GPT2LMHeadModel(config).eval()
    expected = source.state_dict()
    torch.save(expected, work / "state.pt")
    writers: dict[str, Callable[[Path], object]] = {
        "tg.save": lambda f: tg.save(source, f / "model.safetensors"),
        "tg.save shards": lambda f: tg.save(source, f / "model.safetensors",
                                            max_shard_size="40KB"),
        "tg.convert": lambda f: tg.convert(work / "state.pt", f / "model.safetensors"),
    }
    failed = False
    for name, write in writers.items():
        folder = work / name.replace(" ", "_")
        folder.mkdir()
        write(folder)
        config.save_pretrained(folder)
        loaded = transformers.GPT2LMHeadModel.from_pretrained(folder).state_dict()
        same = all(torch.equal(loaded[k], v) for k, v in expected.items())
        failed |= not same
        print(f"{name}: transformers {transformers.__version__} from_pretrained "
              f"{'bit for bit' if same else 'DIFFERS'}")
    single = huggingface_hub.load_state_dict_from_file(work / "tg.save" / "model.safetensors")
    same = all(torch.equal(single[k], v) for k, v in expected.items() if k in single)
    failed |= not same
    print(f"tg.save: huggingface_hub {huggingface_hub.__version__} load_state_dict_from_file "
          f"{'bit for bit' if same else 'DIFFERS'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
