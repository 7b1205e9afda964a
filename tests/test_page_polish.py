"""After a new user's try (issue 20), the page's text and files: colours that share a panel stand apart,
the legend lists only what the loaded models produce, the stats line keeps each number with its label,
the guide explains every drafter count, and a run's CSV reads like a spreadsheet and back like records."""

from __future__ import annotations

import csv
import io
from types import SimpleNamespace

from playground import bench
from playground.engine import METHODS, source_labels
from playground.ui import guide, history, render
from playground.ui.app import legend_sources
from test_models_history import summary


def _lab(colour: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB hex colour."""
    rgb = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    xyz = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)
    fx, fy, fz = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in xyz]
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def delta_e(a: str, b: str) -> float:
    """CIE76 colour difference (about 2.3 is just noticeable; above 10 reads as another colour)."""
    return sum((x - y) ** 2 for x, y in zip(_lab(a), _lab(b))) ** 0.5


def test_colours_that_share_a_panel_stand_apart():
    """Within one method's sources (a mixture's members included) every two colours differ by ΔE ≥ 14; the
    pairs a new user mixed up (suffix tan / recycling slate, draft green / EAGLE depth 1) by far more."""
    c = render.SOURCE_COLORS
    for m, info in METHODS.items():
        srcs = [s for s in info.sources if s in c]
        for i, a in enumerate(srcs):
            for b in srcs[i + 1:]:
                assert delta_e(c[a], c[b]) >= 14, (m, a, b, delta_e(c[a], c[b]))
    assert delta_e(c["suffix"], c["recycling"]) >= 18
    assert min(delta_e(c["draft"], c[f"eagle_d{d}"]) for d in range(1, 11)) >= 20
    # and those a later user mixed up: REST against Medusa's first head, the draft against EAGLE in a mixture
    assert delta_e(c["rest"], c["medusa_head_1"]) >= 24 and delta_e(c["draft"], c["eagle"]) >= 24


def test_token_text_keeps_a_contrast_above_7_on_every_source_colour():
    """render.SOURCE_COLORS promises dark token text a WCAG contrast above 7:1 on every background."""
    def luminance(h: str) -> float:
        def lin(x: float) -> float:
            return x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4
        r, g, b = (int(h[i:i + 2], 16) / 255 for i in (1, 3, 5))
        return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)
    text = luminance(render.TOKEN_TEXT_COLOR)
    for source, colour in render.SOURCE_COLORS.items():
        assert (luminance(colour) + 0.05) / (text + 0.05) > 7, (source, colour)


def test_legend_lists_only_what_the_loaded_models_produce():
    """No EAGLE colours without an EAGLE head, no Medusa heads beyond those loaded; EAGLE's depths as one ramp."""
    def engine(missing: set, heads: int):
        return SimpleNamespace(medusa=SimpleNamespace(num_heads=heads) if heads else None,
                               unavailable_reason=lambda m: "missing" if m in missing else None)

    bare = legend_sources(engine({"eagle", "medusa", "draft_model"}, 0))
    assert "target" in bare and "prompt_lookup" in bare and "draft" not in bare
    assert not [s for s in bare if s.startswith(("eagle_d", "medusa_head_"))]
    full = legend_sources(engine(set(), 2))
    assert [s for s in full if s.startswith("medusa_head_")] == ["medusa_head_1", "medusa_head_2"]
    out = render.legend_html(full, source_labels())
    assert out.count('class="legend-item legend-ramp"') == 1 and "EAGLE depth 1–10" in out
    assert out.count('class="ramp-step"') == 10 and 'title="EAGLE depth 7"' in out
    assert out.count('class="legend-item') == len([s for s in full if not s.startswith("eagle_d")]) + 1


def test_stats_line_keeps_numbers_with_their_labels():
    """τ, α, TTFT and tok/s are joined to their values by non-breaking spaces; EAGLE's last tree size, which
    repeats its mean, is left out."""
    stats = {"new_tokens": 10, "steps": 4, "tokens_per_s": 20.0, "tau": 2.5, "alpha": None, "ttft_s": 0.1,
             "drafter": {"tree_nodes": 2, "mean_tree_nodes": 2.0}}
    line = render.stats_line(stats, baseline_tokens_per_s=10.0, is_baseline=False)
    for joined in ("τ\u00a02.50", "α\u00a0–", "TTFT\u00a00.10\u00a0s", "20.0\u00a0tok/s", "4\u00a0steps"):
        assert joined in line, (joined, line)
    assert "2.0\u00a0mean tree nodes per step" in line and "2 tree nodes" not in line.replace("\u00a0", " ")


def test_guide_explains_every_drafter_count_and_the_timing():
    """Each count a drafter adds to the stats line has a line in the guide; "α –" is explained; tok/s and
    TTFT say what the engine times (RunStats: tokens_per_s counts the prefill; ttft_s is the prefill)."""
    out = guide.reading_guide_html(["target"], source_labels())
    for one, many in render.DRAFTER_INFO_LABELS.values():
        assert any(many.split(" ")[0] in t for t, _ in guide.DRAFTER_TERMS), many
    for words in ("n-grams in the pool", "steps with a pool hit", "tokens with a recycling row",
                  "earlier outputs in the cache", "Per-head acceptance", "mean tree nodes per step"):
        assert words in out, words
    assert "“α –” means nothing was drafted" in out
    terms = dict(guide.GUIDE_TERMS)
    assert "prompt reading included" in terms["tok/s"] and "also counted in tok/s" in terms["TTFT"]


def test_run_csv_has_plain_text_empty_cells_and_speedup():
    """Text cells without JSON quotes, no "null", speedup and the lossless check as columns; the benchmark's
    reader gives back the same records."""
    s = summary()
    s["methods"]["prompt_lookup"]["lossless"] = "match"
    entry = history.add_run([], s)[0]
    recs = history.records(entry)
    text = bench.to_csv(recs)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows[0]["question_id"] == "playground-run-1" and rows[0]["prompt"] == "Tell me a <b>story</b>"
    assert rows[0]["target"] == "SmolLM2" and "draft" not in rows[0]  # no draft: no column at all
    assert "null" not in text and '""playground' not in text
    assert rows[0]["acceptance_rate"] == ""  # the baseline drafted nothing
    assert float(rows[0]["speedup"]) == 1.0 and float(rows[1]["speedup"]) > 1.0
    assert rows[1]["lossless"] == "match" and rows[0]["lossless"] == ""
    assert bench.from_csv(text) == recs


def test_csv_keeps_types_of_text_that_looks_like_json():
    """A text that would read as JSON ("81", "true", "[x") is quoted; a number stays a number."""
    recs = [{"question_id": 81, "category": "qa", "prompt": "81", "draft": "true", "note": "[x", "seed": None}]
    back = bench.from_csv(bench.to_csv(recs))
    assert back == [{k: v for k, v in recs[0].items() if v is not None}]
