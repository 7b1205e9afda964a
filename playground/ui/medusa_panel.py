"""The Medusa section of the page: tree presets, a JSON editor for custom trees with validation,
a picture of the tree in use, the tree chosen for this device, per-head acceptance, and a note
on typical acceptance.

:func:`build` is called inside the Medusa settings accordion with the method's knob inputs (the
``tree_choices`` dropdown is the value every run reads; the editor writes a validated custom
tree into it). The pure helpers (:func:`tree_svg`, :func:`head_acceptance_markdown`) return
strings and need no model.
"""

from __future__ import annotations

import html
import json

import gradio as gr

from playground.engine import describe_medusa_tree, head_acceptance, head_source, medusa_tree
from playground.engine import AUTO_TREE as AUTO, TREE_DESCRIPTIONS, TREE_PRESETS
from playground.engine import TreeChoicesError, parse_tree_choices, tree_buffers

from . import render
from .wording import choice_label

TYPICAL_NOTE = ("**Acceptance.** *exact* keeps the target's own output: under greedy decoding Medusa matches the "
                "baseline token for token; under sampling the one-hot speculative rule keeps the target's "
                "distribution. *typical* (Medusa's typical acceptance) also accepts any candidate whose probability "
                "exceeds min(threshold, alpha * exp(-entropy)): more tokens per step, but the output can differ "
                "from the target's, so it trades exactness for speed.")
NODE_W, LEVEL_H, RADIUS = 26, 46, 10


def tree_svg(choices) -> str:
    """An SVG picture of a tree: the root at the top, one row per depth, nodes coloured by the
    head they come from and labelled with their top-k index."""
    b = tree_buffers(choices)
    kids = [[] for _ in range(len(b) + 1)]
    for i, p in enumerate(b.parents.tolist()):
        kids[p + 1].append(i)
    # 1. Leaves get consecutive x slots (depth-first); a parent sits above the middle of its children.
    x: dict[int, float] = {}
    slot = [0]

    def place(node: int) -> float:  # node -1 is the root
        children = kids[node + 1]
        if not children:
            x[node] = slot[0]
            slot[0] += 1
        else:
            xs = [place(c) for c in children]
            x[node] = (xs[0] + xs[-1]) / 2
        return x[node]
    place(-1)
    width = max(slot[0], 1) * NODE_W + 2 * NODE_W
    height = (b.max_depth + 1) * LEVEL_H + 2 * RADIUS

    def pos(node: int) -> tuple[float, float]:
        depth = 0 if node < 0 else int(b.depths[node])
        return NODE_W * 1.5 + x[node] * NODE_W, RADIUS + 6 + depth * LEVEL_H
    # 2. Edges, then nodes on top.
    parts = []
    for i, p in enumerate(b.parents.tolist()):
        (x1, y1), (x2, y2) = pos(p), pos(i)
        parts.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="#9ca3af"/>')
    rx, ry = pos(-1)
    parts.append(f'<circle cx="{rx:.1f}" cy="{ry:.1f}" r="{RADIUS}" fill="{render.source_color("target")}" '
                 f'stroke="#374151"><title>root: the last emitted token</title></circle>')
    for i in range(len(b)):
        cx, cy = pos(i)
        head = int(b.depths[i])
        title = html.escape(f"path {list(b.choices[i])}: head {head}'s token #{int(b.ranks[i])}")
        parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{RADIUS}" fill="{render.source_color(head_source(head))}" '
                     f'stroke="#374151"><title>{title}</title></circle>'
                     f'<text x="{cx:.1f}" y="{cy + 4:.1f}" font-size="10" text-anchor="middle" '
                     f'fill="#111827">{int(b.ranks[i])}</text>')
    legend = " ".join(f'<span style="display:inline-block;width:10px;height:10px;border-radius:5px;'
                      f'background:{render.source_color(head_source(k))};border:1px solid #374151"></span> head {k}'
                      for k in range(1, b.max_depth + 1))
    return (f'<div class="medusa-tree"><div style="font-size:0.85em">{len(b)} node{"" if len(b) == 1 else "s"}, depth {b.max_depth}; '
            f'row d = head d, the number = its top-k index. {legend}</div>'
            f'<div style="overflow-x:auto"><svg width="{width:.0f}" height="{height:.0f}" '
            f'xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg></div></div>')


def head_acceptance_markdown(stats: dict) -> str:
    """One Markdown line of per-head acceptance from a Medusa run's statistics (empty before any step)."""
    rows = head_acceptance(stats)
    if not rows:
        return ""
    return ("Per-head acceptance: " + ", ".join(
        f"head {r['head']} {r['rate']:.0%} (given head {r['head'] - 1}: {r['conditional']:.0%})" if r["head"] > 1
        else f"head 1 {r['rate']:.0%}" for r in rows))


def _paths_for(engine, value) -> list[list[int]]:
    """The paths a tree value means with ``engine``'s heads (presets trimmed to the heads; auto chosen)."""
    if getattr(engine, "medusa", None) is not None:
        return medusa_tree(engine, value)
    if value == AUTO:
        raise ValueError("the auto tree is chosen once Medusa heads are loaded")
    if isinstance(value, str) and value in TREE_PRESETS:
        return [list(p) for p in TREE_PRESETS[value]]
    return [list(p) for p in parse_tree_choices(value)]


def describe(engine, value) -> tuple[str, str, str]:
    """(editor text, picture HTML, description Markdown) for a tree value; errors become the message."""
    try:
        paths = _paths_for(engine, value)
        text = json.dumps([list(p) for p in paths])
        if getattr(engine, "medusa", None) is not None:
            info = describe_medusa_tree(engine, value)
        else:
            info = TREE_DESCRIPTIONS.get(value, "custom tree") if isinstance(value, str) else "custom tree"
        return text, tree_svg(paths), f"Tree in use: {html.escape(info)}"
    except (ValueError, TreeChoicesError) as e:
        return gr.skip(), gr.skip(), (f"⚠️ {html.escape(str(e))}. Run refuses this tree until it is fixed: "
                                      "pick a preset, or edit the JSON below and press Use this tree.")


def check_custom(engine, text: str):
    """Validate the editor's JSON; on success put it in the tree dropdown and redraw the picture."""
    num_heads = engine.medusa.num_heads if getattr(engine, "medusa", None) is not None else None
    try:
        paths = [list(p) for p in parse_tree_choices(text, num_heads=num_heads)]
    except TreeChoicesError as e:
        return gr.skip(), gr.skip(), (f"⚠️ {html.escape(str(e))}. Not applied: Medusa still uses the tree "
                                      "drawn below.")
    value = json.dumps(paths)
    return (gr.update(value=value), tree_svg(paths),
            f"Tree in use: custom, {len(paths)} node{'' if len(paths) == 1 else 's'}, depth {max(len(p) for p in paths)} (valid)")


def shown(engine, value) -> tuple[str, str, str]:
    """(editor text, picture HTML, description Markdown) of the section for ``engine`` and the tree
    value ``value``: :func:`describe` with Medusa heads loaded; without them a small example tree
    (the editor still validates) and no description."""
    if getattr(engine, "medusa", None) is None:
        return "[[0], [0, 0], [0, 1], [0, 0, 0]]", tree_svg(TREE_PRESETS["depth3"]), ""
    return describe(engine, value)  # on a bad value: the message, the editor and picture unchanged


def build(engine, knobs: dict, models=None) -> None:
    """Lay out the Medusa section (inside the Medusa settings accordion).

    Args:
        engine: the server's engine (``engine.medusa`` may be None: the editor still validates).
        knobs: the medusa knob inputs by knob name (``tree_choices``, ``acceptance``, ...).
        models: the Models tab's :class:`~.models_tab.ModelsPanel`: the handlers use the session's
            engine (its ``key`` state) and the section is redrawn after a load; None: ``engine``.
    """
    tree = knobs["tree_choices"]
    presets = ", ".join(f"**{choice_label('tree_choices', name)}**: {desc}" for name, desc in TREE_DESCRIPTIONS.items())
    gr.Markdown(f"Tree presets: {presets}.", elem_id="medusa-presets")
    text, picture, info = (v if isinstance(v, str) else "" for v in shown(engine, tree.value))
    editor = gr.Code(value=text, language="json", label="Custom tree (JSON list of "
                     "index paths)", lines=3, elem_id="medusa-tree-json", interactive=True)
    apply = gr.Button("Use this tree", size="sm", elem_id="medusa-tree-apply")
    message = gr.Markdown(info, elem_id="medusa-tree-info")
    picture_html = gr.HTML(picture, elem_id="medusa-tree-picture")
    gr.Markdown(TYPICAL_NOTE, elem_id="medusa-typical-note")
    key = [models.key] if models is not None else []

    def session(k=None):  # the session's engine (the server's without a Models tab)
        return models.engine_for(k) if models is not None else engine

    tree.change(lambda v, *k: describe(session(*k), v), [tree, *key], [editor, picture_html, message],
                api_visibility="private")
    apply.click(lambda t, *k: check_custom(session(*k), t), [editor, *key], [tree, picture_html, message],
                api_visibility="private")
    if models is not None:
        models.follow(lambda e, _key, v: shown(e, v), [tree], [editor, picture_html, message])
