"""Stop strings (issue 16, item 5): every method ends its output at the first token whose text
completes a stop string (the string kept, as transformers' ``stop_strings`` does), with finish
reason ``"stop"``, and lossless methods equal the baseline cut at the same token."""

from __future__ import annotations

import pytest

from playground.engine import BASELINE, Engine, GenerationSettings, MethodSpec, RunOutput

pytestmark = pytest.mark.real_model

PROMPT = ("Copy this list exactly, twice: alpha beta gamma delta epsilon zeta eta theta iota kappa. "
          "alpha beta gamma delta epsilon zeta eta theta iota kappa.")
METHODS = [BASELINE, "prompt_lookup", "lookahead"]


def run(engine: Engine, ids: list[int], stops=(), methods=METHODS, max_new_tokens=48) -> dict[str, RunOutput]:
    outs = {m: RunOutput(m, {}) for m in methods}
    settings = GenerationSettings(max_new_tokens, stop_strings=stops)
    for event in engine.run(ids, [MethodSpec(m) for m in methods], settings):
        outs[event.method].add(event)
    return outs


@pytest.fixture(scope="module")
def setup(real_target):
    engine = Engine(real_target)
    ids = engine.encode_prompt(PROMPT)
    free = run(engine, ids)
    return engine, ids, free


def pieces_of(engine: Engine, ids: list[int]) -> list[str]:
    """The text each output token adds (incremental, as the events carry it)."""
    return [engine.decode_text(ids[:i + 1])[len(engine.decode_text(ids[:i])):] for i in range(len(ids))]


def test_a_stop_string_spanning_two_tokens_ends_every_method_at_that_token(setup):
    engine, ids, free = setup
    base = free[BASELINE].ids
    pieces = pieces_of(engine, base)
    # The end of one token's text plus the start of the next: a stop string no single token holds.
    i = next(i for i in range(3, len(pieces) - 1) if len(pieces[i].strip()) >= 2 and len(pieces[i + 1].strip()) >= 2)
    stop = pieces[i][-2:] + pieces[i + 1][:2]
    text = engine.decode_text(base)
    first = text.index(stop)
    # the first token whose text completes the stop string
    cut = next(k for k in range(len(base)) if stop in engine.decode_text(base[:k + 1]))
    assert first + len(stop) <= len(engine.decode_text(base[:cut + 1]))
    outs = run(engine, ids, (stop, "never-in-this-output"))
    for m, out in outs.items():
        assert out.last.finish_reason == "stop", m
        assert out.ids == base[:cut + 1], m
        assert stop in out.text and out.text == engine.decode_text(out.ids), m


def test_a_stop_string_inside_an_accepted_block_cuts_the_block(setup):
    engine, ids, free = setup
    pl = free["prompt_lookup"]
    # A step that accepted several prompt-lookup tokens: stop at the text of its middle token.
    sources = pl.sources
    k = next(k for k in range(1, len(sources) - 1)
             if sources[k] == "prompt_lookup" and sources[k - 1] == "prompt_lookup" and sources[k + 1] == "prompt_lookup")
    pieces = pieces_of(engine, pl.ids)
    stop = (pieces[k - 1] + pieces[k]).strip()[-6:]
    cut = next(j for j in range(len(pl.ids)) if stop in engine.decode_text(pl.ids[:j + 1]))
    assert cut <= k
    outs = run(engine, ids, (stop,))
    for m, out in outs.items():
        assert out.last.finish_reason == "stop", m
        assert out.ids == pl.ids[:cut + 1] == free[BASELINE].ids[:cut + 1], m
        assert out.last.stats.new_tokens == cut + 1


def test_stop_strings_are_checked_before_any_work(real_target):
    with pytest.raises(ValueError, match="at most 8 strings"):
        GenerationSettings(stop_strings=[str(i) for i in range(9)])
    with pytest.raises(ValueError, match="1 to 64 characters"):
        GenerationSettings(stop_strings=[""])
    with pytest.raises(TypeError, match="must be text"):
        GenerationSettings(stop_strings=[3])
    assert GenerationSettings(stop_strings="END").stop_strings == ("END",)


def test_the_page_passes_stop_strings_one_per_line(real_target):
    """The page's stop-strings field (one per line) reaches every method; the panels' status says why
    the output ended."""
    from playground.ui.app import run_arguments, run_comparison

    engine = Engine(real_target)
    free = run(engine, engine.encode_prompt(PROMPT), methods=[BASELINE])[BASELINE]
    stop = engine.decode_text(free.ids)[10:14]
    args = run_arguments(PROMPT, [BASELINE, "prompt_lookup"], max_new_tokens=48, stop_strings=[stop, "zzzz"])
    last = list(run_comparison(engine, *args))[-1]
    assert sum("done (stop string)" in str(x) for x in last) == 2
    bad = run_arguments(PROMPT, [BASELINE], stop_strings="x" * 65)
    assert "Stop strings: each stop string must have 1 to 64 characters" in str(list(run_comparison(engine, *bad))[-1])
