"""Searching what a diverging unit's tensors should hold, by running both models' code.

Where outputs are compared and diverge, the unit where they first do is searched: hypotheses
generated from the vocabulary of layout operations (a fused tensor's rows in every grouping and
order of parts, rotary row orders, same-shape siblings exchanged, transposes, and combinations
of them) are tried on the unit alone, on its inputs captured once, until its output agrees with
the reference's (:mod:`.unit`). What a hypothesis changes is an edit of the plan's steps
(:mod:`.edits`), so what was found is recorded as the plan's own steps. Running models with
hooks lives in :mod:`.activations`.
"""
