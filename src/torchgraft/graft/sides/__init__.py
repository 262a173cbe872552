"""The two sides of a graft: opening a source, describing a model, what each states.

Opening a source (:mod:`.source`), a PEFT adapter beside it (:mod:`.adapters`), a model's
tensors and kinds (:mod:`.model`) from one walk (:mod:`.walk`), attention head counts
(:mod:`.heads`) and what both sides state of them (:mod:`.describe`); modules built with
their parameters on meta (:mod:`.build`); inputs, by role, bound to each model's ``forward``
by argument name (:mod:`.inputs`).
"""
