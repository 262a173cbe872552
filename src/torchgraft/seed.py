"""``tg.seed_everything``: the same random numbers, and optionally the same kernels, every run."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["seed_everything"]


def seed_everything(seed: int, *, deterministic: bool = False) -> None:
    """Seed Python, NumPy and torch (every CUDA device too).

    Args:
        seed: The seed.
        deterministic: Also make torch choose deterministic kernels:
            ``torch.use_deterministic_algorithms(True)``, cuDNN ``deterministic=True`` and
            ``benchmark=False``, and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (needed by cuBLAS).
            Slower, as cuDNN's documentation warns; an operation with no deterministic kernel then
            raises instead of varying.
    """
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
