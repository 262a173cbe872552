"""Planning a graft on metadata alone: the plan's steps as data, the passes that make them.

The plan (:mod:`.steps`) and the operations its steps apply (:mod:`.adapt`); building it
(:mod:`.build`) in passes (:mod:`.passes`): names, structure (:mod:`.structure`), what each
pair needs (:mod:`.transforms`); running it backwards (:mod:`.reverse`).
"""
