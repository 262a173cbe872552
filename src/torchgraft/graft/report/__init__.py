"""The graft report: every key, what happened to it and why, as text, JSON and HTML.

The report (:mod:`.report`), its HTML page (:mod:`.html`), and its scope for a PEFT adapter
(:mod:`.adapter_scope`).
"""
