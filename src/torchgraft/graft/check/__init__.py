"""Checking a graft by outputs: what to compare with, on which inputs, and settling guesses.

The reference a graft is compared with (:mod:`.reference`), the source's own model
(:mod:`.source_model`), the comparison (:mod:`.compare`) on inputs bound to each model
(:mod:`~torchgraft.graft.sides.inputs`), and
settling guesses where outputs diverge (:mod:`.settle`).
"""
