r"""The graft report as one self-contained HTML page: both module trees, side by side.

Every target tensor is coloured by how it was filled (exact, wrapper, rule, layout, structure,
adapted, re-initialised, tied, new, missing) and linked to the source tensor that filled it;
every source tensor links back, or is marked unused. Each row shows the tensor's shape and
dtype, two tags (how it was filled, and the evidence for its match: name, structure, guess,
verified) and, for anything not plainly loaded, the reason, in the page (not only on hover).
The title and the header name the checkpoint and the model; the header gives the verdict,
whether outputs were compared, what needs a look first (:data:`ATTENTION`: missing keys,
guesses, where outputs diverge), one line per module, linked, and the command that settles
the graft, ready to copy. Only the modules that hold such a key open; the rest are collapsed.
Key names break only after a dot or an underscore, prose between words. A search box filters
keys (``?q=text`` in the address fills it; modules with no key left are hidden, those with one
open), and a checkbox per kind and per evidence filters by them, each labelled with the word
its tags show.
No network: styles and the few lines of script are inline.

Everything the page shows from a checkpoint or a model (key names, shapes, reasons, messages)
is text: HTML-escaped, its control and direction characters written out (``\x1b``, ``\u202e``),
so a key can neither add markup nor pass for another. A Content-Security-Policy allows the
page's own style and script only (by their SHA-256), nothing else: no other script, no style
attribute, no request. The module trees are built and rendered without recursion, at most
:data:`MAX_DEPTH` modules deep (a key of 3,000 dotted parts keeps its deeper parts in one
header).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ...text import one_line
from ...units import plural

if TYPE_CHECKING:
    import torch

    from ..tensors import TensorInfo
    from .report import GraftReport

__all__ = ["ATTENTION", "EVIDENCE", "KINDS", "MAX_DEPTH", "describe", "render_html"]

#: The most module levels the page's trees show: deeper parts of a key stay in one header.
MAX_DEPTH = 32

#: Kinds of keys, in the order the filters list them, with their colours.
KINDS: dict[str, str] = {
    "exact": "#2e7d32", "wrapper": "#558b2f", "prefix": "#689f38", "rule": "#00838f",
    "layout": "#1565c0", "structure": "#6a1b9a", "adapted": "#ef6c00",
    "reinitialised": "#c62828", "tied": "#5d4037", "missing": "#b71c1c", "unused": "#757575",
    "base": "#9e9e9e", "initialised": "#0277bd", "new": "#283593",
}
#: Evidence for a match, in the order the filters list them (the same words as the tags).
EVIDENCE = ("name", "structure", "guess", "verified")
#: What needs a look: keys of these kinds or this evidence (a re-initialised head holds no
#: trained values), and those under a module whose activations diverge, are listed first and
#: their modules open.
ATTENTION = ("missing", "guess", "diverged", "reinitialised")
#: The most keys the header lists as needing a look (the filters find the rest).
_LISTED = 20
#: Kinds whose reason is shown under the key (a plain load needs none).
_EXPLAINED = ("adapted", "reinitialised", "tied", "missing", "unused", "base", "structure",
              "initialised", "new")

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{padding:12px 20px;background:#f5f5f5;border-bottom:1px solid #ddd}
h1{font-size:18px;margin:0 0 6px}h2{font-size:15px;margin:8px 0}
.ok{color:#2e7d32}.bad{color:#c62828}.compared{margin:2px 0;color:#444}
#filters{padding:8px 20px;border-bottom:1px solid #ddd;position:sticky;top:0;background:#fff}
#filters label{margin-right:12px;white-space:nowrap;cursor:pointer}
#filters .group{color:#666;margin-right:6px}
#search{margin-right:16px;padding:2px 6px;width:18em}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin:0 4px}
main{display:grid;grid-template-columns:1fr 1fr;gap:16px;padding:0 20px 40px}
details{margin-left:14px}summary{cursor:pointer;color:#444}
.n{color:#999;font-size:12px}
.t{margin-left:28px;padding:1px 6px;border-left:4px solid;font-family:ui-monospace,monospace;
   font-size:13px;overflow-wrap:break-word}
.sides{margin:0 0 4px;color:#444}
pre.command{background:#263238;color:#eceff1;padding:6px 10px;margin:4px 0;white-space:pre-wrap;
   overflow-wrap:break-word;user-select:all}
.t a{color:inherit;opacity:.75;margin-left:8px}
.t .m{color:#666;margin-left:8px;font-size:12px}
.t .e,.t .k{color:#666;margin-left:6px;font-size:11px;border:1px solid #ccc;border-radius:3px;
      padding:0 3px}
.t.look{background:#fff3e0}
#attention{margin:4px 0}#attention a{color:#b71c1c}
.t .why{color:#444;font-family:system-ui,sans-serif;font-size:12px;white-space:normal}
.t:target{background:#fff59d}
ul.notes{margin:4px 0;padding-left:20px}
"""

_SCRIPT = """
var search = document.getElementById('search');
var boxes = document.querySelectorAll('#filters input[type=checkbox]');
function filter() {
  var text = search.value.toLowerCase(), off = {};
  boxes.forEach(function (box) { if (!box.checked) { off[box.value] = true; } });
  document.querySelectorAll('.t').forEach(function (row) {
    row.hidden = (text !== '' && row.dataset.key.toLowerCase().indexOf(text) < 0)
      || off['kind-' + row.dataset.kind] === true
      || off['evidence-' + row.dataset.evidence] === true;
  });
  document.querySelectorAll('main details').forEach(function (module) {
    var shown = module.querySelector('.t:not([hidden])') !== null;
    module.hidden = !shown;
    if (shown && text !== '') { module.open = true; }
  });
}
boxes.forEach(function (box) { box.addEventListener('change', filter); });
search.addEventListener('input', filter);
search.value = new URLSearchParams(location.search).get('q') || '';
filter();
"""


def describe(info: TensorInfo) -> str:
    """A tensor's shape and dtype as the page shows them: ``(64, 3, 7, 7) float32``."""
    return _described(tuple(info.shape), info.dtype)


@functools.lru_cache(maxsize=4096)
def _described(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    """One text per shape and dtype: models of 100k tensors have a few dozen of them."""
    return f"{shape} {str(dtype).removeprefix('torch.')}"


def _target_kind(report: GraftReport, key: str) -> str:
    if key in report.reinitialised:
        return "reinitialised"
    if key in report.tied:
        return "tied"
    if key in report.missing:
        return "missing"
    if key in report.new:
        return "new"
    if key in report.not_in_adapter:
        return "base"
    if key in report.initialised:
        return "initialised"
    if key in report.adapted:
        return "adapted"
    return report.matched_by.get(key, "exact")


def _target_note(report: GraftReport, key: str) -> str:
    if key in report.mapping:
        how = report.adapted.get(key) or f"matched by {report.matched_by[key]}"
        guess = f" ({report.guesses[key].describe()})" if key in report.guesses else ""
        return f"<- {report.mapping[key]}: {how}{guess}"
    if key in report.tied:
        return f"tied to {report.tied[key]}"
    if key in report.new:
        return report.new[key]
    if key in report.initialised and key not in report.missing:
        return f"computed by the model's code: {report.initialised[key]}"
    return report.reasons.get(key, "")


def _text(text: str) -> str:
    """Text from a file as the page shows it: escaped, control characters written out."""
    return html.escape(one_line(text))


def _name(key: str) -> str:
    """A key or module name as the page shows it: it may break after a dot or an underscore.

    A long name wraps between its parts (``<wbr>``), never inside one.
    """
    return "<wbr>".join(_text(part) + sep for part, sep in _parts(key))


def _parts(key: str) -> list[tuple[str, str]]:
    """A name cut after each dot and underscore: ``(part, separator)`` pairs."""
    parts: list[tuple[str, str]] = []
    start = 0
    for i, char in enumerate(key):
        if char in "._":
            parts.append((key[start:i], char))
            start = i + 1
    parts.append((key[start:], ""))
    return parts


def _modules(key: str) -> list[str]:
    """The modules a key's tree shows it under: at most :data:`MAX_DEPTH` levels."""
    *path, _leaf = key.split(".")
    if len(path) > MAX_DEPTH:
        path[MAX_DEPTH - 1:] = [".".join(path[MAX_DEPTH - 1:])]
    return path


def _tree(keys: Iterable[str]) -> dict[str, Any]:
    """Keys as nested modules: ``{"layer1.": {"conv.": {"layer1.conv.weight": None}}}``."""
    root: dict[str, Any] = {}
    for key in keys:
        node = root
        for part in _modules(key):
            node = node.setdefault(part + ".", {})
        node[key] = None
    return root


def _render_tree(root: dict[str, Any], row: Callable[[str], tuple[str, bool]],
                 out: list[str]) -> int:
    """Render the tree into ``out``, a module's header counting its tensors; no recursion.

    A module opens only where it holds a key that needs a look (``row`` says which); the
    others are collapsed.

    Returns:
        How many tensors the tree holds.
    """
    # Each open module: its items left to render, its name, what it rendered, its counts of
    # tensors and of those that need a look.
    stack: list[tuple[Any, str, list[str], list[int]]] = [(iter(root.items()), "", out, [0, 0])]
    while stack:
        items, name, parts, count = stack[-1]
        for child_name, child in items:
            if child is not None:
                stack.append((iter(child.items()), child_name, [], [0, 0]))
                break
            shown, look = row(child_name)
            parts.append(shown)
            count[0] += 1
            count[1] += look
        else:
            stack.pop()
            if stack:
                _, _, outer, outer_count = stack[-1]
                opened = " open" if count[1] else ""
                outer.append(f"<details{opened}><summary>{_name(name.removesuffix('.'))} "
                             f"<span class=n>{count[0]}</span></summary>{''.join(parts)}"
                             "</details>")
                outer_count[0] += count[0]
                outer_count[1] += count[1]
    return count[0]


def _row(key: str, anchor: str, kind: str, *, shape: str | None, links: str, evidence: str,
         why: str, look: bool) -> str:
    """One tensor: its leaf name, shape and dtype, tags (kind, evidence), links, the reason."""
    parts = [f"<b>{_name(key.rpartition('.')[2])}</b>"]
    if shape:
        parts.append(f"<span class=m>{_text(shape)}</span>")
    parts.append(f"<span class=k>{html.escape(kind)}</span>")
    if evidence:
        parts.append(f"<span class=e>{_text(evidence)}</span>")
    parts.append(links)
    if why and (kind in _EXPLAINED or look):
        parts.append(f"<div class=why>{_text(why)}</div>")
    hover = f"{key} | evidence: {evidence}" if evidence else key
    kind = html.escape(kind)
    return (f'<div class="t kind-{kind}{" look" if look else ""}" id="{anchor}" '
            f'data-kind="{kind}" data-evidence="{_text(evidence)}" data-key="{_text(key)}" '
            f'title="{_text(hover)}">{"".join(parts)}</div>')


def _sides(report: GraftReport) -> str:
    """``resnet18.pth into ResNet18``: what was grafted into what, where the report knows."""
    if not report.source_name and not report.model_name:
        return ""
    return f"{report.source_name or 'a checkpoint'} into {report.model_name or 'a model'}"


def _policy(style: str, script: str) -> str:
    """A Content-Security-Policy allowing this style and this script only, by their hashes."""
    def digest(text: str) -> str:
        return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()

    return (f"default-src 'none'; style-src 'sha256-{digest(style)}'; "
            f"script-src 'sha256-{digest(script)}'; base-uri 'none'; form-action 'none'")


def _compared(report: GraftReport) -> str:
    """Whether outputs were compared, and what came of it."""
    if report.divergence:
        return f"outputs compared: they differ ({report.divergence})"
    if report.max_abs_diff is not None:
        return (f"outputs compared: equal within tolerance (max |difference| "
                f"{report.max_abs_diff:.3g}); every loaded key is verified")
    return ("outputs not compared (no source module and example inputs): the matches rest on "
            "names and structure, as each key's evidence says")


def _needs_look(report: GraftReport, key: str) -> str:
    """Why a model key needs a look (:data:`ATTENTION`), or ``""``."""
    if key in report.missing:
        return "missing"
    if key in report.guesses:
        return "guess"
    if report.diverged_at is not None and key.startswith(f"{report.diverged_at}."):
        return "diverged"
    if key in report.reinitialised:
        return "reinitialised"
    return ""


def _attention(looks: dict[str, str], anchors: dict[str, str]) -> str:
    """The header's list of what needs a look, first: one link per module.

    At most :data:`_LISTED` lines; the keys of one module that need a look for one reason
    are one line (``missing: classifier (2 keys)``), linked to its first key.
    """
    if not looks:
        return ""
    modules: dict[tuple[str, str], list[str]] = {}
    for key, why in looks.items():
        modules.setdefault((why, key.rpartition(".")[0] or key), []).append(key)
    items = [f'<li>{why}: <a href="#{anchors[keys[0]]}">'
             + (f"{_name(module)} ({len(keys)} keys)" if len(keys) > 1 else _name(keys[0]))
             + "</a></li>" for (why, module), keys in list(modules.items())[:_LISTED]]
    if len(modules) > _LISTED:
        items.append(f"<li>and {len(modules) - _LISTED} more modules: the filters and the open "
                     "modules below show each</li>")
    return (f"<h2>needs a look: {plural(len(looks), 'key')} in "
            f"{plural(len(modules), 'module')}</h2><ul id=attention>{''.join(items)}</ul>")


def _filters(kinds: dict[str, int], evidence: dict[str, int]) -> str:
    """The search box, then a checkbox per kind and per evidence present, with its count."""
    def boxes(group: str, counts: dict[str, int], order: Iterable[str]) -> str:
        return f"<span class=group>{group}:</span>" + "".join(
            f'<label><input type=checkbox checked value="{group}-{name}">'
            + (f'<span class="swatch swatch-{name}"></span>' if group == "kind" else "")
            + f"{name} ({counts[name]})</label>" for name in order if counts.get(name))

    return ("<input type=search id=search placeholder='search keys' aria-label='search keys'>"
            + boxes("kind", kinds, KINDS) + boxes("evidence", evidence, EVIDENCE))


def render_html(report: GraftReport, *, title: str | None = None,
                command: str | None = None) -> str:
    """Render a graft report as a self-contained HTML page.

    Args:
        report: The report.
        title: The page title; by default the checkpoint, the model and the verdict.
        command: The command that settles the graft, shown to copy; by default the report's
            own (:meth:`GraftReport.settle_call`), if any.

    Returns:
        The page.
    """
    sides = _sides(report)
    title = title or f"{sides or 'graft'}: {report.verdict.value} - torchgraft"
    command = command if command is not None else report.settle_call()
    targets = report.targets or [*dict.fromkeys([
        *report.loaded, *report.reinitialised, *report.tied, *report.new, *report.missing,
        *report.not_in_adapter, *report.initialised])]
    sources = report.sources or [*dict.fromkeys([*report.mapping.values(), *report.unused])]
    target_id = {k: f"t{i}" for i, k in enumerate(targets)}
    source_id = {k: f"s{i}" for i, k in enumerate(sources)}
    filled_by: dict[str, list[str]] = {}
    for target, source in report.mapping.items():
        filled_by.setdefault(source, []).append(target)
    kinds: dict[str, int] = dict.fromkeys(KINDS, 0)
    evidences: dict[str, int] = dict.fromkeys(EVIDENCE, 0)
    looks = {key: why for key in targets if (why := _needs_look(report, key))}

    def evidence_of(key: str) -> str:
        evidence = report.evidence.get(key)
        return evidence.value if evidence is not None else ""

    def target_row(key: str) -> tuple[str, bool]:
        kind = _target_kind(report, key)
        kinds[kind] = kinds.get(kind, 0) + 1
        evidence = evidence_of(key)
        evidences[evidence] = evidences.get(evidence, 0) + 1
        link = ""
        if key in report.mapping and report.mapping[key] in source_id:
            link = (f'<a href="#{source_id[report.mapping[key]]}">&larr; '
                    f"{_name(report.mapping[key])}</a>")
        return _row(key, target_id[key], kind, shape=report.shapes.get(key), links=link,
                    evidence=evidence, why=_target_note(report, key),
                    look=key in looks), key in looks

    def source_row(key: str) -> tuple[str, bool]:
        users = filled_by.get(key, [])
        kind = _target_kind(report, users[0]) if users else "unused"
        if not users:
            kinds["unused"] += 1
        links = "".join(f'<a href="#{target_id[u]}">&rarr; {_name(u)}</a>' for u in users
                        if u in target_id)
        why = "" if users else "not used: " + report.reasons.get(key, "nothing in the model "
                                                                       "takes it")
        look = any(u in looks for u in users)
        return _row(key, source_id[key], kind, shape=report.shapes.get(f"checkpoint:{key}"),
                    links=links, evidence=evidence_of(users[0]) if users else "", why=why,
                    look=look), look

    target_html: list[str] = []
    _render_tree(_tree(targets), target_row, target_html)
    source_html: list[str] = []
    _render_tree(_tree(sources), source_row, source_html)
    counts = report.headline().partition(": ")[2]
    verdict = (f'<span class="{"ok" if report.ok else "bad"}">'
               f'{_text(report.headline().partition(": ")[0])}</span>')
    notes = [*(f"assumed: {a.describe()}" for a in report.assumptions),
             *([report.settle()] if report.settle() else []), *report.warnings]
    style = _STYLE + "".join(f".kind-{k}{{border-color:{c};color:{c}}}"
                             f".swatch-{k}{{background:{c}}}" for k, c in KINDS.items())
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="Content-Security-Policy" content="{_policy(style, _SCRIPT)}">'
        f"<title>{_text(title)}</title><style>{style}</style></head><body>"
        f"<header><h1>{verdict}: {_text(counts)}</h1>"
        + (f"<p class=sides id=sides>{_text(sides)}</p>" if sides else "")
        + f"<p class=compared id=compared>{_text(_compared(report))}</p>"
        + _attention(looks, target_id)
        + (f"<ul class=notes>{''.join(f'<li>{_text(n)}</li>' for n in notes)}</ul>"
           if notes else "")
        + (f"<h2>copy and run:</h2><pre class=command id=command>{_text(command)}</pre>"
           if command else "")
        + f"</header><nav id=filters>{_filters(kinds, evidences)}</nav><main>"
        f"<section id=target><h2>model: {len(targets)} tensors</h2>{''.join(target_html)}"
        f"</section><section id=source><h2>checkpoint: {len(sources)} tensors</h2>"
        f"{''.join(source_html)}</section></main><script>{_SCRIPT}</script></body></html>"
    )
