"""The page's state during one run: each method's panel HTML, stats line and lossless badge, the charts,
and the run's plain-data summary (:meth:`RunView.summary`: what the insight charts, the Theory, History and
Advisor tabs read).

:func:`~playground.ui.app.run_comparison` feeds it one step at a time (:meth:`RunView.add`, plain dicts
from :mod:`.worker`) and sends :meth:`RunView.values` to the page.
"""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from playground.engine import BASELINE, METHODS, Engine, MethodSpec, RunOutput, source_labels
from playground.engine import GenerationSettings, check_lossless, is_lossless

from . import charts, medusa_panel, render, step_inspector, worker


class RunView:
    """The page's state during one run (one instance per call: nothing is shared)."""

    def __init__(self, engine: Engine, specs: list[MethodSpec], settings: GenerationSettings, prompt: str = ""):
        self.engine = engine
        self.prompt, self.settings = prompt, worker.settings_dict(settings)  # for the run history
        self.chosen = [s.name for s in specs]
        self.greedy = settings.sampling.greedy
        self.outputs = {s.name: RunOutput(s.name, s.params) for s in specs}
        self.reasons: dict[str, str | None] = {m: None for m in self.chosen}
        self.checks: dict[str, str] = {}  # method -> "match" / "near_tie" / "mismatch" once compared
        self.stats: dict[str, dict] = {}
        self.timelines: dict[str, list[tuple[float, int]]] = {}
        self.per_step: dict[str, list[int]] = {m: [] for m in self.chosen}  # tokens emitted by each step
        self.steps = step_inspector.RunSteps(self.chosen)  # the trees each step verified, for the inspector
        self.status = ""
        self.shown = False  # whether the panels have been sent (the run's start event came)
        self.html = {m: "" for m in METHODS}
        self.stats_md = {m: "" for m in METHODS}
        self.badge_md = {m: "" for m in METHODS}
        for m in self.chosen:
            self.html[m] = render.placeholder("waiting for the first token…")
            self.badge_md[m] = self._badge(m)
        self.colors = {METHODS[m].label: charts.method_color(m) for m in METHODS}
        self.refresh_figures()

    def add(self, event: dict) -> None:
        """Take one step's plain data (:func:`worker.event_dict`)."""
        m = event["method"]
        out = self.outputs[m]
        if out.last is None:
            self.html[m] = ""  # drop the placeholder; from here on the panel only grows
        out.add(SimpleNamespace(**event))  # RunOutput reads tokens, sources, margins, pieces
        self.html[m] += self.steps.add(event, render.token_spans(event["pieces"], source_labels()))
        self.stats[m] = event["stats"]
        self.timelines.setdefault(m, []).append(tuple(event["point"]))
        if event["tokens"]:
            self.per_step[m].append(len(event["tokens"]))
        if event["finished"]:
            self.reasons[m] = event["finish_reason"] or "done"
            if event.get("error"):  # this method failed; the others ran on (events.round_robin)
                self.html[m] += render.placeholder(
                    f"{METHODS[m].label} failed{' here' if out.ids else ' before its first token'}: "
                    f"{event['error']}. The other methods ran on; the server's log has the details.")
            elif not out.ids:
                self.html[m] = render.placeholder("(no text: the model ended its answer at once)")
        for name in self.chosen:
            self.stats_md[name] = self._stats_line(name) if name in self.stats else ""
            self.badge_md[name] = self._badge(name)

    def _stats_line(self, m: str) -> str:
        base = self.stats.get(BASELINE, {}).get("tokens_per_s") if BASELINE in self.chosen else None
        line = render.stats_line(self.stats[m], baseline_tokens_per_s=base or None, is_baseline=m == BASELINE,
                                 finish_reason=self.reasons[m])
        if m == "medusa":  # acceptance of each head (depth d of the tree = head d)
            line += "\n\n" + medusa_panel.head_acceptance_markdown(self.stats[m])
        return line

    def _badge(self, m: str) -> str:
        info = METHODS[m]
        if m == BASELINE:
            if not self.greedy:
                return render.badge("info", "the baseline: under sampling no output is checked against it token "
                                            "for token (each method keeps the target's distribution)")
            return render.badge("info", "this is the reference output the other methods are checked against")
        if not info.lossless:
            return render.badge("info", "this method is not lossless by design: its output may differ")
        if not is_lossless(m, self.outputs[m].params):  # e.g. Medusa with typical acceptance
            return render.badge("info", "typical acceptance trades exactness for speed: the output may differ "
                                        "from the baseline's")
        if not self.greedy:
            return render.badge("info", "sampling (temperature > 0): the token-for-token check applies "
                                        "to greedy decoding only")
        if BASELINE not in self.chosen:
            return render.badge("info", "no baseline ran: tick Autoregressive to check this output "
                                        "against it")
        mine, base = self.reasons.get(m), self.reasons.get(BASELINE)
        if mine is None or base is None:
            return render.badge("info", "checked once this method and the baseline have both finished")
        if "error" in (mine, base):
            return render.badge("error", "failed: its output is not checked" if mine == "error" else
                                "the baseline failed: nothing to check this output against")
        b, ids = self.outputs[BASELINE], self.outputs[m].ids
        if "cancelled" in (mine, base):  # stopped: compare the tokens both have
            n = min(len(b.ids), len(ids))
            if n == 0:
                return render.badge("info", "stopped before both had a token: nothing to compare")
            check = check_lossless(b.ids[:n], b.margins[:n], ids[:n], self.engine.target.dtype)
            kind = self.checks[m] = "match" if check.matched else "near_tie" if check.near_tie else "mismatch"
            text = f"stopped: its first {render.plural(n, 'token')} match the baseline's" if check.matched \
                else f"stopped: {check.message()}"
            return render.badge(kind, text)
        check = check_lossless(b.ids, b.margins, ids, self.engine.target.dtype)
        kind = self.checks[m] = "match" if check.matched else "near_tie" if check.near_tie else "mismatch"
        return render.badge(kind, check.message())

    def stop(self) -> str:
        """Mark every unfinished method as stopped; returns the status text ("Stopped after N tokens
        of the baseline", or the most any method produced when the baseline did not run)."""
        for m in self.chosen:
            if self.reasons[m] is None:
                self.reasons[m] = "cancelled"
                if self.outputs[m].last is None:
                    self.html[m] = render.placeholder("stopped before the first token")
        for m in self.chosen:
            self.stats_md[m] = self._stats_line(m) if m in self.stats else ""
            self.badge_md[m] = self._badge(m)
        if BASELINE in self.chosen:
            n, whose = len(self.outputs[BASELINE].ids), " of the baseline"
        else:
            n, whose = max((len(self.outputs[m].ids) for m in self.chosen), default=0), ""
        return f"Stopped after {render.plural(n, 'token')}{whose}; each panel shows how far its method got."

    def abandon(self) -> None:
        """The run ended on a warning or an error: a panel still waiting for its first token says it
        did not run (the status line says why), with no stats line or badge; panels with text keep
        theirs. The charts show only the methods that ran."""
        for m in self.chosen:
            if self.outputs[m].last is None:
                self.html[m] = render.placeholder("not run: see the status line above")
                self.stats_md[m] = self.badge_md[m] = ""
        self.refresh_figures()

    def refresh_figures(self) -> None:
        """Rebuild the charts from the statistics so far."""
        timeline = {METHODS[m].label: list(self.timelines.get(m, [])) for m in self.chosen}
        speed = {METHODS[m].label: self.stats[m].get("tokens_per_s", 0.0) for m in self.chosen if m in self.stats}
        self.chart = charts.timeline_figure(timeline, self.colors)
        self.bars = charts.speed_figure(speed, self.colors)

    def summary(self) -> dict:
        """The run as plain data for the insight charts, Theory and History tabs: ``{"target", "draft", "dtype",
        "prompt", "settings" (worker.settings_dict), "baseline_tokens_per_s", "methods": {method: {"label", "params",
        "stats" (RunStats.as_dict), "tokens_per_step", "output_ids", "output_text", "margins", "finish_reason", "lossless"}}, "greedy"}``."""
        base = self.stats.get(BASELINE, {}).get("tokens_per_s") if BASELINE in self.chosen else None
        draft = getattr(self.engine, "draft", None)
        return {"target": self.engine.target.name, "draft": draft.name if draft is not None else None,
                "dtype": str(self.engine.target.dtype).removeprefix("torch."), "prompt": self.prompt,
                "settings": self.settings, "baseline_tokens_per_s": base or None, "greedy": self.greedy,
                "methods": {m: {"label": METHODS[m].label, "params": self.outputs[m].params,
                                "stats": self.stats.get(m, {}), "tokens_per_step": list(self.per_step[m]),
                                "output_ids": list(self.outputs[m].ids), "output_text": self.outputs[m].text,
                                "margins": list(self.outputs[m].margins), "finish_reason": self.reasons[m],
                                "lossless": self.checks.get(m)}
                            for m in self.chosen}}

    def values(self, final: bool = False) -> tuple:
        """Every output value, in the order of the handler's outputs (the last-run state only when ``final``).

        Whole values each time: Gradio sends only the difference from the previous update
        (an append for a growing panel, nothing for an unchanged one).
        """
        out: list = [self.status]
        for m in METHODS:
            out += [self.html[m], self.stats_md[m], self.badge_md[m]]
        # A run refused before it started leaves the step inspector on the last run that ran, as the
        # "Inside the last run" charts (fed by the last-run state) stay.
        return tuple(out + [self.chart, self.bars, self.steps if self.shown else gr.skip(),
                            self.summary() if final else gr.skip()])
