"""How two sides of a graft store the same thing: reversible operations, rules, layouts, tables.

The vocabulary of operations (:mod:`.ops`), the users' rules (:mod:`.rules`,
:mod:`.op_rules`), the catalogue of layouts between frameworks and code bases
(:mod:`.catalogue`), and the hints planning ranks candidates with: roles by name
(:mod:`.conventions`), gated MLPs' halves (:mod:`.glu`), norms' unit offsets (:mod:`.norms`),
bare parameters (:mod:`.bare`), fused projections (:mod:`.fusion`) and experts
(:mod:`.experts`). Imports nothing of the stages above it.
"""
