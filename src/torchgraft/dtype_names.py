"""The dtype names torchgraft accepts for casts, without importing torch."""

from __future__ import annotations

__all__ = ["ALIASES", "CASTS"]

#: Short names to torch's own (``"bf16"`` is ``torch.bfloat16``).
ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
           "float": "float32", "fp64": "float64", "double": "float64"}

#: The floating-point dtypes a cast (``dtype=``, CLI ``--dtype``) writes, then their aliases.
CASTS = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
         *ALIASES)
