"""The web UI end to end through gradio_client, on the real embedded default model (float32, CPU).

Checks, with short generations (a few seconds each on 2 CPU cores):

* a two-method greedy run streams both panels, fills the stats lines and the charts, and
  prompt lookup's lossless badge says it matched the baseline;
* bad input (empty prompt, no method, an unavailable method, a knob out of range) gives a
  clear message, and the server still serves the next request;
* two clients running at once both finish, each with its own correct output;
* Stop (cancelling a run) leaves the server serving;
* plus fast checks of the rendering helpers (no model).
"""

from __future__ import annotations

import html
import re
import threading

import pytest

from playground.engine import METHODS
from playground.engine import source_labels
from playground.engine import GENERATION_KNOBS
from playground.ui import input_names, run_arguments
from playground.ui import render
from ui_fixtures import serve, ui_engine

gradio_client = pytest.importorskip("gradio_client")

OUTPUTS = ["status"] + [f"{m}_{part}" for m in METHODS for part in ("html", "stats", "badge")] + ["chart", "bars"]
REPEAT_PROMPT = ("Repeat this sentence three times: The quick brown fox jumps over the lazy dog near the "
                 "river bank.")


def _named(values) -> dict:
    """One streamed update as {output name: value}."""
    assert len(values) == len(OUTPUTS), f"expected {len(OUTPUTS)} outputs, got {len(values)}"
    return dict(zip(OUTPUTS, values))


def _done(final: dict) -> bool:
    """Whether the status line says the run finished."""
    return "pill-done" in final["status"] and "Done in" in _text(final["status"])


def _text(panel_html: str) -> str:
    """The plain text of a tokens panel."""
    return html.unescape(re.sub(r"<[^>]+>", "", panel_html))


@pytest.fixture(scope="module")
def url(request):
    with serve(ui_engine(request)) as u:
        yield u


@pytest.fixture()
def client(url):
    return gradio_client.Client(url, verbose=False)


def _run(client, prompt, methods, **kwargs):
    """Submit a run and return (all streamed updates as dicts, final update as dict)."""
    job = client.submit(*run_arguments(prompt, methods, **kwargs), api_name="/run")
    updates = [_named(u) for u in job]
    return updates, _named(job.result())


# ----- end to end ---------------------------------------------------------------------------
@pytest.mark.real_model
def test_two_methods_stream_colour_and_match_baseline(client):
    """Greedy autoregressive + prompt lookup: both panels stream source-tagged tokens, the
    stats lines and charts fill, and prompt lookup's output equals the baseline's."""
    updates, final = _run(client, REPEAT_PROMPT, ["autoregressive", "prompt_lookup"], max_new_tokens=24)

    assert _done(final), final["status"]
    # Streaming: some update showed partial text before the end.
    partial = [u for u in updates[:-1] if 'class="tok"' in u["autoregressive_html"]]
    assert partial, "the autoregressive panel never streamed before the final update"
    assert len(_text(partial[0]["autoregressive_html"])) < len(_text(final["autoregressive_html"]))

    for m in ("autoregressive", "prompt_lookup"):
        panel = final[f"{m}_html"]
        assert 'data-source="target"' in panel, f"{m}: no target-coloured token"
        assert _text(panel).strip(), f"{m}: empty panel"
        stats = final[f"{m}_stats"]
        for part in ("new tokens", "steps", "tok/s", "τ", "α", "TTFT"):
            assert part in stats, f"{m} stats line lacks {part!r}: {stats}"
    assert "1.00× (baseline)" in final["autoregressive_stats"]
    assert "vs autoregressive" in final["prompt_lookup_stats"]
    # The repeated sentence lets prompt lookup copy from the prompt.
    assert 'data-source="prompt_lookup"' in final["prompt_lookup_html"]
    assert "matches the baseline token for token" in final["prompt_lookup_badge"], final["prompt_lookup_badge"]
    assert _text(final["prompt_lookup_html"]) == _text(final["autoregressive_html"])
    # The unselected panel stays empty; both charts name both methods.
    assert final["draft_model_html"] == ""
    for chart in ("chart", "bars"):
        assert final[chart]["type"] == "plotly"
        assert "Autoregressive" in final[chart]["plot"] and "Prompt lookup" in final[chart]["plot"]


@pytest.mark.real_model
def test_bad_input_shows_a_message_and_server_keeps_serving(client):
    """Empty prompt, no method, an unavailable method and an out-of-range knob each give a clear
    message (never a crash); a good request right after succeeds."""
    _, final = _run(client, "   ", ["autoregressive"])
    assert "prompt is empty" in final["status"] and "pill-warning" in final["status"], final["status"]

    _, final = _run(client, "Hello", [])
    assert "no method is ticked" in final["status"] and "pill-warning" in final["status"], final["status"]

    _, final = _run(client, "Hello", ["autoregressive", "draft_model"])
    assert "no draft model is loaded" in final["status"] and "pill-warning" in final["status"], final["status"]

    # A knob out of range reaches the handler (no Gradio preprocess error, no server traceback),
    # which refuses the run with a message naming the knob and its bounds.
    _, final = _run(client, "Hello", ["prompt_lookup"], params={"prompt_lookup": {"max_ngram_size": 0}})
    assert "Max n-gram size: allowed values are 1 to 8" in final["status"] and "pill-warning" in final["status"], \
        final["status"]

    _, final = _run(client, "Say hello.", ["autoregressive"], max_new_tokens=4)
    assert _done(final), final["status"]
    assert _text(final["autoregressive_html"]).strip()


@pytest.mark.real_model
def test_two_concurrent_clients_both_finish(url):
    """Two sessions at once, each its own method on the same prompt (greedy): both finish, and
    the texts are equal (prompt lookup is lossless), so neither run saw the other's state."""
    results: dict[str, dict] = {}
    errors: list[BaseException] = []

    def go(method):
        try:
            c = gradio_client.Client(url, verbose=False)
            results[method] = _run(c, REPEAT_PROMPT, [method], max_new_tokens=12)[1]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=go, args=(m,)) for m in ("autoregressive", "prompt_lookup")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert set(results) == {"autoregressive", "prompt_lookup"}
    for m, final in results.items():
        assert _done(final), (m, final["status"])
        assert "no baseline ran" in final[f"{m}_badge"] or m == "autoregressive"
    assert _text(results["autoregressive"]["autoregressive_html"]).strip()
    assert _text(results["autoregressive"]["autoregressive_html"]) == \
        _text(results["prompt_lookup"]["prompt_lookup_html"])


@pytest.mark.real_model
def test_each_session_learns_from_its_own_runs_only(request):
    """Suffix decoding's cache of earlier outputs (what its drafts, rejected ones included, are made
    of) is kept per browser session: two clients' runs fill two scopes, the unscoped state stays empty."""
    from playground.engine.suffix import SuffixCache

    engine = ui_engine(request)
    with serve(engine) as u:
        clients = [gradio_client.Client(u, verbose=False) for _ in range(2)]  # open until the check
        for c, prompt in zip(clients, ("Say hello.", "Name a colour.")):
            assert _done(_run(c, prompt, ["suffix"], params={"suffix": {"budget": "off"}}, max_new_tokens=6)[1])
        caches = {k.split("/")[0]: v for k, v in engine._persistent.items() if isinstance(v, SuffixCache)}
        assert len(caches) == 2 and all(k.startswith("learned@") for k in caches), list(engine._persistent)
        assert all(len(cache) == 1 for cache in caches.values())  # one output each, not both


@pytest.mark.real_model
def test_cancel_then_serve_again(client):
    """Cancelling a long run (what Stop does) ends it; the next request is served."""
    job = client.submit(*run_arguments("Write a long story about a dragon.", ["autoregressive"],
                                       max_new_tokens=400), api_name="/run")
    for values in job:
        if 'class="tok"' in _named(values)["autoregressive_html"]:
            break
    assert job.cancel()
    _, final = _run(client, "Say hello.", ["autoregressive"], max_new_tokens=3)
    assert _done(final), final["status"]


# ----- no model ----------------------------------------------------------------------------
def test_run_arguments_follow_input_names():
    """run_arguments lays values out in input_names order, with knob defaults filled in."""
    names = input_names()
    args = run_arguments("p", ["prompt_lookup"], params={"prompt_lookup": {"num_pred_tokens": 5}},
                         max_new_tokens=7)
    v = dict(zip(names, args))
    assert len(args) == len(names)
    assert v["prompt"] == "p" and v["use_prompt_lookup"] and not v["use_autoregressive"]
    assert v["prompt_lookup_num_pred_tokens"] == 5 and v["max_new_tokens"] == 7
    assert v["seed"] == next(k.default for k in GENERATION_KNOBS if k.name == "seed")
    with pytest.raises(TypeError):
        run_arguments("p", [], bogus=1)


def test_token_spans_escape_text_and_tag_sources():
    """Token text is HTML-escaped and each span carries its source and colour."""
    out = render.token_spans([("<b>&", "target"), ("x\n", "prompt_lookup"), ("", "draft")], source_labels())
    assert "&lt;b&gt;&amp;" in out and "<b>" not in out
    assert out.count('class="tok"') == 2
    assert f'background:{render.SOURCE_COLORS["prompt_lookup"]}' in out
    assert render.source_color("medusa_head_3") == render.source_color("medusa_head_3")


def _line(*args, **kwargs) -> str:
    """A stats line with its non-breaking spaces read as spaces (they keep each "label value" pair whole)."""
    return render.stats_line(*args, **kwargs).replace("\u00a0", " ")


def test_stats_line_and_badges():
    stats = {"new_tokens": 10, "steps": 4, "tokens_per_s": 20.0, "tau": 2.5, "alpha": 0.5, "ttft_s": 0.1}
    line = _line(stats, baseline_tokens_per_s=10.0, is_baseline=False, finish_reason="length")
    assert "**10** new tokens" in line and "2.00× vs autoregressive" in line and "α 50%" in line
    assert "done (max new tokens)" in line
    line = _line({**stats, "alpha": None}, baseline_tokens_per_s=None, is_baseline=False)
    assert "no baseline" in line and "α –" in line and "done" not in line
    line = _line({**stats, "drafter": {"pool_ngrams": 42, "pool_hits": 7}}, baseline_tokens_per_s=10.0,
                             is_baseline=False)
    assert "42 n-grams in the pool" in line and "7 steps with a pool hit" in line
    assert render.drafter_figure("datastore_tokens", 3253579) == "3,253,579 tokens in the datastore"
    line = _line({**stats, "new_tokens": 1, "steps": 1}, baseline_tokens_per_s=None, is_baseline=True)
    assert "**1** new token ·" in line and "1 step ·" in line
    assert render.plural(85, "token") == "85 tokens" and render.plural(1, "category", "categories") == "1 category"
    assert "pill-match" in render.badge("match", "ok") and "✓" in render.badge("match", "ok")
    assert "&lt;x&gt;" in render.status_html("warning", "<x>")


def test_knob_inputs_leave_the_range_check_to_the_handler():
    """A typed value out of range passes the widget (no Gradio error and traceback) and the
    warning names the allowed range."""
    import gradio as gr
    from playground.engine import Knob
    from playground.ui.knobs import knob_input, out_of_range_message

    knob = Knob("window", "Window W", 1, 20, 4)
    with gr.Blocks():
        box = knob_input(knob, "w")
    assert box.get_block_name() == "slider" and box.preprocess(50) == 50
    assert "1 to 20" in out_of_range_message(knob, "Window W", 50)
    assert out_of_range_message(knob, "Window W", 7) is None
    # A group whose choices a handler replaces: a stale tick reaches the handler (its own message),
    # not Gradio's "not in the list of choices" error (seen when Run beat the new choices to the page).
    from playground.ui.knobs import LooseCheckboxGroup

    with gr.Blocks():
        group = LooseCheckboxGroup(["writing"], value=["writing"])
    group.choices = []
    assert group.preprocess(["writing"]) == ["writing"] and group.preprocess(None) == []


def test_token_colours_differ_and_legend_lists_loaded_heads():
    """Every token source has its own colour; the legend lists only the loaded Medusa heads."""
    from types import SimpleNamespace

    from playground.ui.app import legend_sources

    colours = list(render.SOURCE_COLORS.values())
    assert len(set(colours)) == len(colours)
    engine = SimpleNamespace(medusa=SimpleNamespace(num_heads=4))
    heads = [s for s in legend_sources(engine) if s.startswith("medusa_head_")]
    assert heads == [f"medusa_head_{k}" for k in range(1, 5)]
    assert not [s for s in legend_sources(SimpleNamespace(medusa=None)) if s.startswith("medusa_head_")]


def _cielab(hex_colour: str) -> tuple[float, float, float]:
    """CIELAB (D65 white) of an sRGB ``#rrggbb`` colour, by the standard formulas."""
    srgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = [((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92 for c in srgb]
    x, y, z = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b,
               (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)
    f = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in (x, y, z)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def test_every_method_colour_is_far_from_the_others():
    """Ten methods side by side on one chart: no two share a hue a reader can confuse (the mixture's
    dark yellow sat 22 CIELAB units from prompt lookup's amber); at least 30 apart."""
    from itertools import combinations

    from playground.ui import charts

    colours = {m: charts.method_color(m) for m in METHODS}
    for (m1, c1), (m2, c2) in combinations(colours.items(), 2):
        distance = sum((p - q) ** 2 for p, q in zip(_cielab(c1), _cielab(c2))) ** 0.5
        assert distance >= 30, (m1, c1, m2, c2, distance)


def test_one_method_colour_for_all_charts():
    """Playground charts (by label) and Benchmark charts (by method name) colour a method alike."""
    from playground.ui import charts

    for m, info in METHODS.items():
        assert charts.method_color(m) == charts.method_color(info.label)
    fig = charts.bench_speedup_figure([{"category": "overall", "method": m, "speedup": 1.0}
                                       for m in ("autoregressive", "medusa")])
    assert fig.data[0].marker.color == charts.method_color("Medusa")
