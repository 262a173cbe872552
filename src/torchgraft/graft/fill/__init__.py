"""Filling a model from a plan: every tensor's bytes touched once, straight into the model.

A model as a whole (:mod:`.target`): storage for a meta model (:mod:`.materialise`), each
rank's shards (:mod:`.dtensor`), then the plan's steps (:mod:`.execute`); a quantized model
(:mod:`.quantized`).
"""
