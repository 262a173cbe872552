"""Each rank of an FSDP2 model materialises its share of the file, not the file.

Counted, not timed: the bytes each of 2 gloo ranks brings into memory from the file (read,
or viewed through a mapping) while grafting, at most 1.2 x its share of the tensors plus the
largest tensor (an adaptation may read one whole tensor at a time). A ``.pt`` whose tensors
were saved transposed (``w.t()``, strides of a column-major matrix) was read whole through the
file's mapping by every rank, which kept every page resident: 386 MiB per rank for a 256 MiB
file on 2 ranks (bench/sharded.py), now each rank's blocks, read as runs of the stored order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from tests.graft.fill.sharded_memory_ranks import reference

pytestmark = pytest.mark.slow  # one launch of 2 ranks: about ten seconds

ROOT = Path(__file__).resolve().parents[3]
RANKS = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, int, list[dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("memory")
    state = reference().state_dict()
    torch.save(nn.DataParallel(reference()).state_dict(), folder / "dp.pt")
    transposed = {k: v.t().contiguous().t() if v.dim() == 2 else v for k, v in state.items()}
    assert not transposed["0.weight"].is_contiguous()
    torch.save(transposed, folder / "transposed.pt")
    torch.save(transposed, folder / "transposed_mapped.pt")
    save_file(state, folder / "model.safetensors")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={RANKS}",
         "--standalone", str(Path(__file__).with_name("sharded_memory_ranks.py")), str(folder)],
        env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    total = sum(v.numel() * v.element_size() for v in state.values())
    largest = max(v.numel() * v.element_size() for v in state.values())
    return total, largest, [json.loads((folder / f"rank{r}.json").read_text())
                            for r in range(RANKS)]


@pytest.mark.parametrize("file", ["dp.pt", "transposed.pt", "model.safetensors"])
def test_each_rank_materialises_its_share(ranks: tuple[int, int, list[dict[str, Any]]],
                                          file: str) -> None:
    total, largest, results = ranks
    for rank, result in enumerate(results):
        assert result[file]["ok"] and result[file]["exact"], (rank, result[file])
        assert result[file]["bytes"] <= 1.2 * total / RANKS + largest, (rank, result[file])
        assert result[file]["bytes"] >= total / RANKS * 0.8, (rank, result[file])  # counted


def test_the_broken_twin_reading_through_the_mapping_is_over_the_bound(
        ranks: tuple[int, int, list[dict[str, Any]]]) -> None:
    total, largest, results = ranks
    for result in results:
        assert result["transposed_mapped.pt"]["exact"]
        assert result["transposed_mapped.pt"]["bytes"] > 1.2 * total / RANKS + largest
