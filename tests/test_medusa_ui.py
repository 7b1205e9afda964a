"""The Medusa section of the page, without a browser: the page builds with and without heads, the
custom-tree editor validates with the engine's messages, the tree picture and per-head line render."""

from __future__ import annotations

import pytest
import torch

from helpers import FakeLoaded, tiny_llama
from playground.engine import Engine, medusa_auto_tree
from test_medusa import random_heads

gr = pytest.importorskip("gradio")
from playground.ui import build_demo, medusa_panel  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_single_thread")


class _Tokenizer:
    chat_template = None
    eos_token_id = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1, 2, 3]}

    def decode(self, ids, **kwargs):
        return "x" * len(ids)


def _engine(with_heads: bool) -> Engine:
    model = tiny_llama(0)
    loaded = FakeLoaded(model, tokenizer=_Tokenizer())
    loaded.device, loaded.dtype, loaded.spec = torch.device("cpu"), torch.float32, "tiny"
    heads = None
    if with_heads:
        heads = random_heads(model, 3)
        heads.top_k_accuracy = [[0.6] * 10, [0.4] * 10, [0.3] * 10]
    return Engine(loaded, medusa=heads)


def test_page_builds_with_and_without_heads():
    """With heads the page builds and the auto tree is chosen (and named); without, it still builds."""
    engine = _engine(True)
    build_demo(engine)
    # "N nodes, depth d: ..." or, when timing noise makes plain decoding look best, "1 node: ..."
    assert engine.has_persistent("medusa_auto_tree") and " node" in medusa_auto_tree(engine)[0].describe()
    build_demo(_engine(False))


def test_custom_tree_editor_messages():
    """The editor accepts a valid tree (and draws it) and shows the validation message otherwise."""
    engine = _engine(True)
    _, picture, message = medusa_panel.check_custom(engine, "[[0], [0, 0], [1]]")
    assert "valid" in message and "<svg" in picture
    for text, expected in (("[[0], [0, 0", "not valid JSON"), ("[[0], [-1]]", "negative index"),
                           ("[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]", "beyond the 3 Medusa heads"),
                           ("[[0], [12]]", "beyond the heads&#x27; top-10"), ("[[0], [0]]", "appears twice"),
                           ("[[0], [2, 0]]", "has no parent")):
        message = medusa_panel.check_custom(engine, text)[2]
        assert expected in message and "Not applied: Medusa still uses the tree drawn below" in message, text
    # A broken tree typed into the tree box itself: the message says Run refuses it (nothing claims
    # that an earlier tree is still in use).
    message = medusa_panel.describe(engine, "[[0],[5,")[2]
    assert "Run refuses this tree until it is fixed" in message and "still" not in message


def test_tree_picture_and_head_line():
    """The picture has one circle per node plus the root; the per-head line gives rates and the
    conditional rates."""
    svg = medusa_panel.tree_svg([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    assert svg.count("<circle") == 6 and "5 nodes, depth 3" in svg
    line = medusa_panel.head_acceptance_markdown({"per_position_acceptance": [0.5, 0.25]})
    assert line == "Per-head acceptance: head 1 50%, head 2 25% (given head 1: 50%)"
    assert medusa_panel.head_acceptance_markdown({}) == ""
