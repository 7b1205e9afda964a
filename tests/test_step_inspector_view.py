"""The step inspector's page logic on plain data (no model, no browser): the bounded store, the step
spans of the panels, the drawn tree, and the "why this speed" arithmetic."""

from __future__ import annotations

import re
from collections import Counter

from playground.ui import step_inspector as si


class _Engine:
    """Stands in for the engine: token i reads ``t<i>``; nothing measured."""

    def decode_text(self, ids):
        return f"t{ids[0]}"

    def has_persistent(self, key):
        return False


def _tree(tokens, parents, path, bonus, sources=None, draft_s=0.002, verify_s=0.040):
    depths = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return {"tokens": tokens, "parents": parents, "sources": sources or ["draft"] * len(tokens), "depths": depths,
            "path": path, "rejected": [i for i in range(len(tokens)) if i not in path], "bonus_token": bonus,
            "draft_s": draft_s, "verify_s": verify_s, "extra_queries": 0}


def _event(method, step, tokens, tree, stats=None, finished=False):
    return {"method": method, "step": step, "tokens": tokens, "tree": tree, "stats": stats or {},
            "finished": finished}


def test_store_keeps_the_last_steps_and_wraps_spans():
    """The store keeps at most max_steps steps per method (the newest), counts every step's pass size,
    and wraps each step's text in a span naming the method and step, alternating parity."""
    store = si.RunSteps(["draft_model"], max_steps=3)
    out = [store.add(_event("draft_model", s, [10 + s], _tree([], [], [], 10 + s)), f"<i>{s}</i>")
           for s in range(6)]
    assert store.kept("draft_model") == [3, 4, 5]
    assert store.get("draft_model", 1) is None and store.get("draft_model", 5)["root"] == 14
    assert sum(store.pass_sizes["draft_model"].values()) == 5  # decode steps 1..5, prefill excluded
    assert 'data-method="draft_model" data-step="2"' in out[2] and 'class="step even"' in out[2]
    assert 'class="step odd"' in out[3] and "<i>3</i>" in out[3]
    assert store.add(_event("draft_model", 6, [], _tree([], [], [], 1)), "") == ""


def test_tree_html_marks_accepted_rejected_and_bonus():
    """Root -> a (accepted) -> b (accepted), a -> c (rejected), root -> d (rejected) -> e (under a
    rejected node); bonus 9 after b. The drawn tree nests by parent, marks each node's state, and
    states the step's counts and times."""
    tree = _tree([1, 2, 3, 4, 5], [-1, 0, 0, -1, 3], [0, 1], 9)
    store = si.RunSteps(["draft_model"])
    store.add(_event("draft_model", 0, [7], _tree([], [], [], 7)))
    store.add(_event("draft_model", 1, [1, 2, 9], tree))
    out = si.tree_html(_Engine(), "draft_model", 1, store.get("draft_model", 1), store.kept("draft_model"))
    nodes = {n: s for s, n in re.findall(r'<li class="(node-\w+)" data-node="(\d)"', out)}
    assert nodes == {"0": "node-accepted", "1": "node-accepted", "2": "node-rejected", "3": "node-rejected",
                     "4": "node-rejected"}
    assert "not reached: its parent was rejected" in out and "rejected by the target" in out
    assert "5 candidates proposed, 2 accepted" in out and "→ 3 tokens" in out
    assert "Drafting 2.0 ms, verifying 40.0 ms" in out and "pass over 6 tokens" in out
    assert out.count("node-bonus") == 1 and ">t9<" in out and "root: " in out and ">t7<" in out
    # b's subtree holds the bonus token: it follows the accepted path's last node.
    assert out.index('data-node="1"') < out.index("node-bonus") < out.index('data-node="2"')
    gone = si.tree_html(_Engine(), "draft_model", 99, None, [0, 1])
    assert "No step 99" in gone and "steps 0 to 1 are kept" in gone


def test_why_line_arithmetic():
    """10 decode steps, 21 new tokens after the first (τ 2.0), passes of 5 tokens costing 1.5 plain
    steps, drafting 0.1 s of 1.0 s decode time; the baseline's plain step 0.05 s. Drafting costs
    (0.1 / 10) / 0.05 = 0.2 plain steps, a step 1.7, so 2.0 / 1.7 = 1.18x expected."""
    stats = {"steps": 11, "new_tokens": 21, "proposed": 40, "alpha": 0.25, "elapsed_s": 1.2, "ttft_s": 0.2,
             "draft_s": 0.1, "verify_s": 0.9}
    base = {"steps": 21, "new_tokens": 21, "elapsed_s": 1.2, "ttft_s": 0.2}
    f = si.speed_figures(stats, Counter({5: 10}), [10, 0], lambda q, chain: 1.5 if q == 5 else 1.0, base)
    assert abs(f["tau"] - 2.0) < 1e-9 and abs(f["draft"] - 0.2) < 1e-9 and abs(f["verify"] - 1.5) < 1e-9
    assert abs(f["expected"] - 2.0 / 1.7) < 1e-9
    assert abs(f["measured"] - (20 / 1.0) / (20 / 1.0)) < 1e-9
    line = si.why_line("Draft model", f)
    assert "τ 2.00 tokens per step" in line and "α 25% of 4.0 candidates" in line
    assert "costs 1.70 plain steps (drafting 0.20, verifying 1.50 for a pass over 5.0 tokens) → 1.18× expected, " \
        "1.00× measured" \
        in line
    slow = si.speed_figures({**stats, "new_tokens": 11, "alpha": 0.0}, Counter({5: 10}), [10, 0],
                            lambda q, chain: 1.5, None)
    assert slow["expected"] < 1 and "slower than plain decoding, because" in si.why_line("X", slow)
    # Measured faster than the baseline while the curve says slower (a browser on the same cores):
    # the line says the two disagree instead of calling a 1.20x method slower.
    both = si.why_line("X", {**slow, "measured": 1.2})
    assert "slower than plain decoding by the cost curve" in both and "faster as measured" in both
    assert "baseline" in si.why_line("Autoregressive", f, is_baseline=True)
    assert "too few steps" in si.why_line("X", si.speed_figures({"steps": 1}, Counter(), [0, 0], None, None))


def test_view_defaults_to_the_latest_step_with_candidates():
    """Without a choice the inspector shows the first method that drafted at its latest step with
    candidates, and its slider spans the kept steps."""
    store = si.RunSteps(["autoregressive", "prompt_lookup"])
    for m in store.methods:
        store.add(_event(m, 0, [5], _tree([], [], [], 5), {"steps": 1, "new_tokens": 1}))
    store.add(_event("prompt_lookup", 1, [6, 7], _tree([6, 8], [-1, 0], [0], 7), {"steps": 2, "new_tokens": 3}))
    store.add(_event("prompt_lookup", 2, [9], _tree([], [], [], 9), {"steps": 3, "new_tokens": 4}))
    why, dropdown, slider, fig, tree = si.view(_Engine(), "none", store)
    assert dropdown["value"] == "prompt_lookup" and slider["value"] == 1
    assert slider["minimum"] == 0 and slider["maximum"] == 2
    assert "Step 1 of Prompt lookup" in tree and "Why this speed" in why
    assert fig.data[0].customdata[1][1] == 1
    assert "Step 2 of Prompt lookup" in si.view(_Engine(), "none", store, "prompt_lookup", 2)[-1]


def test_a_large_tree_is_drawn_in_part():
    """A 300-node tree (a binary tree under node 0, path 0 -> 1 -> 3) draws at most MAX_NODES_DRAWN nodes, the
    accepted path among them, and counts the rest."""
    n = 300
    tree = _tree(list(range(n)), [-1] + [(i - 1) // 2 for i in range(1, n)], [0, 1, 3], 7)
    store = si.RunSteps(["eagle"])
    store.add(_event("eagle", 1, [0, 1, 3, 7], tree))
    out = si.tree_html(_Engine(), "eagle", 1, store.get("eagle", 1), [1])
    drawn = len(re.findall(r'data-node="\d+"', out))
    assert drawn <= si.MAX_NODES_DRAWN and f"… {n - drawn} more nodes not drawn" in out
    assert all(f'<li class="node-accepted" data-node="{i}"' in out for i in (0, 1, 3))


def test_verdict_and_why_line_give_the_same_speedup_and_tau():
    """Issue 20: the end-of-run verdict and the "why this speed" line of the same run print one speedup and
    one τ (the stats line's: RunStats tokens_per_s over the baseline's, and RunStats tau); the why-line's
    decode-only figures are labelled as such. Here the prompt's cost makes the two definitions differ."""
    import re

    from playground.ui import guide

    base = {"steps": 21, "new_tokens": 21, "elapsed_s": 3.0, "ttft_s": 2.0, "tokens_per_s": 7.0, "tau": 1.0}
    mix = {"steps": 11, "new_tokens": 21, "proposed": 40, "alpha": 0.25, "elapsed_s": 2.5, "ttft_s": 2.0,
           "draft_s": 0.05, "verify_s": 0.45, "tokens_per_s": 8.4, "tau": 21 / 11}
    summary = {"baseline_tokens_per_s": 7.0, "greedy": True, "methods": {
        "autoregressive": {"label": "Autoregressive", "params": {}, "stats": base, "lossless": None},
        "mixture": {"label": "Mixture", "params": {}, "stats": mix, "lossless": "match"}}}
    verdict = guide.run_verdict(summary)
    v_speed, v_tau = re.search(r"Mixture, ([\d.]+)× the baseline, τ ([\d.]+)", verdict).groups()
    store = si.RunSteps(["autoregressive", "mixture"])
    store.stats = {"autoregressive": base, "mixture": mix}
    store.pass_sizes["mixture"][5] = 10
    store.chain_steps["mixture"] = [10, 0]
    f = si.speed_figures(mix, store.pass_sizes["mixture"], [10, 0], lambda q, chain: 1.5, base)
    line = si.why_line("Mixture", f)
    w_speed, w_tau = re.search(r"\*\*Mixture:\*\* ([\d.]+)× the baseline, τ ([\d.]+) over the whole run", line).groups()
    assert (w_speed, w_tau) == (v_speed, v_tau) == ("1.20", "1.91")
    assert "Decoding steps only" in line and "× measured (decoding only)" in line
    assert f["measured"] != f["overall"]  # the decode-only figure differs, and is labelled
    md = si.why_markdown(None, "no-such-engine", store)
    assert "**Mixture:** 1.20× the baseline, τ 1.91" in md
