"""The page's vLLM tab: the same prompt served by vLLM, one server per method (docs/vllm.md).

Shown when ``app.py`` gets ``--vllm`` (servers started here from ``.venv-vllm`` when the user
presses *Start vLLM servers*) or ``--vllm-url NAME=URL`` (servers already running). Each method's
panel streams its answer through the OpenAI API; when the answer is complete the tokens are
coloured by source from vLLM's per-request speculative-decoding metrics, with the statistics of
the built-in panels (tokens/s, speedup, tau, alpha, TTFT, per-position acceptance) and a lossless
check against vLLM's own baseline. Methods run one after another, the baseline first (the
servers share this machine's cores). Times are client times of HTTP requests (see
:data:`playground.backends.vllm.bench.TIMING`). Stop closes the stream; vLLM aborts the request.
"""

from __future__ import annotations

import argparse
import html
import logging
import threading
import time
from dataclasses import dataclass, field

import gradio as gr

from playground.backends.vllm import methods as vm
from playground.backends.vllm.bench import TIMING
from playground.backends.vllm.client import StreamCutter, VLLMError
from playground.backends.vllm.runner import Sampling, run_completion, run_to_end
from playground.backends.vllm.server import (ServerPool, VLLMServerError, detect_device, parse_vllm_urls, share_gpu,
                                             vllm_available)

from . import render
from .wording import method_label
from .run_control import EventPump, StopSignals

log = logging.getLogger(__name__)
STOPS = StopSignals()
"""Stop flags of the vLLM tab's runs in flight, one per browser session."""
PUSH_S = 0.1
"""Least seconds between two streamed text updates of a panel (the text received meanwhile goes in the
next one, at the latest a :data:`.run_control.POLL_S` later)."""
MAX_NEW_TOKENS = 1024
"""Most new tokens the tab asks for (its slider's maximum; the servers' context is 2048)."""


@dataclass
class VLLMSession:
    """The vLLM servers of one app: attached ones, and those started here on demand (stopped at exit).

    A server is *ready* once it runs and has answered one short warm-up request; :attr:`endpoints`
    holds the ready ones. :meth:`ready` (Start, and every Run) starts and warms what the ticked
    methods still lack, under one lock, so a Run pressed while servers start waits for them.

    Args:
        target: the playground target spec the servers run.
        attached: ``{method: url}`` from ``--vllm-url``.
        draft: the draft for draft_model (``--draft``; None: the shipped one with the default target).
        eagle: the EAGLE-3 head for eagle (``--eagle``; None: the shipped one with the default target).
        local: whether servers may be started on this machine (``--vllm``); False (only
            ``--vllm-url``): the tab offers and runs the attached methods only, so no speedup
            divides one machine's speed by another's.
    """

    target: str = "default"
    attached: dict = field(default_factory=dict)
    draft: str | None = None
    eagle: str | None = None
    local: bool = True
    pools: list = field(default_factory=list)
    endpoints: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    warmed: set = field(default_factory=set)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "VLLMSession | None":
        """The session app.py's arguments ask for (None: no vLLM tab).

        Raises:
            ValueError: a malformed ``--vllm-url``.
        """
        if not (getattr(args, "vllm", False) or getattr(args, "vllm_url", None)):
            return None
        return cls(getattr(args, "target", "default"), parse_vllm_urls(args.vllm_url),
                   getattr(args, "draft", None), getattr(args, "eagle", None), bool(getattr(args, "vllm", False)))

    def methods(self) -> list[str]:
        """Methods the tab offers: the attached ones, and with :attr:`local` the supported ones whose
        draft or head this target has."""
        if not self.local:
            return list(self.attached)
        served = [m for m in vm.SUPPORTED if vm.missing_model(m, self.target, self.draft, self.eagle) is None]
        return list(dict.fromkeys(served + list(self.attached)))

    def missing(self, methods: list[str]) -> list[str]:
        """The methods of ``methods`` without a ready server yet."""
        return [m for m in dict.fromkeys(methods) if m not in self.endpoints or m not in self.warmed]

    def ready(self, methods: list[str], prompt_ids: list[int], eos_token_ids: list[int] = (), progress=None,
              run=None) -> dict:
        """Start the servers ``methods`` still lack (attach the attached ones), warm each new one
        up (:meth:`warm_up`), and return every ready endpoint ``{method: Endpoint}``.

        Raises:
            ValueError: a method is neither attached nor may be started here (:attr:`local` False),
                or as :func:`.methods.server_configs`.
            VLLMServerError, VLLMError: a server failed to start or to answer its warm-up request
                (servers started by this call are stopped again on a start failure).
        """
        with self.lock:
            for pool in self.pools:  # a server started here that has exited since: start it again
                for s in pool.servers:
                    if s.process is not None and s.process.poll() is not None:
                        self.endpoints.pop(s.config.name, None)
                        self.warmed.discard(s.config.name)
            todo = [m for m in dict.fromkeys(methods) if m not in self.endpoints]
            local = [m for m in todo if m not in self.attached]
            if local and not self.local:
                raise ValueError(f"no server attached for {', '.join(local)}: attach it with --vllm-url "
                                 f"{local[0]}=URL, or start the app with --vllm to start servers here")
            if todo:
                configs = vm.server_configs(local, target=self.target, draft=self.draft, eagle=self.eagle) if local else []
                if configs:
                    # Each server's share of the GPU counts every server this tab may start, not only
                    # those starting now: a method ticked later starts beside servers holding theirs.
                    configs = share_gpu(configs, detect_device(),
                                        len(set(local) | {m for m in self.methods() if m not in self.attached}))
                pool = ServerPool(configs, {m: self.attached[m] for m in todo if m in self.attached},
                                  progress=progress)
                pool.start()  # on a failure it stops its own servers and raises
                self.pools.append(pool)
                self.endpoints.update(pool.endpoints)
            self.warm_up(prompt_ids, eos_token_ids, run)
            return dict(self.endpoints)

    def warm_up(self, prompt_ids: list[int], eos_token_ids: list[int] = (), run=None) -> list[str]:
        """Send one short request to every server not warmed up yet (as the benchmark's warm-up does):
        a server's first request pays for its lazy initialisation (seconds on a CPU), which would
        otherwise land in the first run's baseline and make every speedup of that run wrong.
        Returns the methods warmed now. ``run`` defaults to :func:`.runner.run_to_end`.

        Raises:
            VLLMError: a server refused or broke off the request.
        """
        from playground.bench.runner import WARMUP_TOKENS

        run = run or run_to_end
        todo = [m for m in self.endpoints if m not in self.warmed]
        for m in todo:
            run(self.endpoints[m], m, prompt_ids, Sampling(WARMUP_TOKENS), list(eos_token_ids))
            self.warmed.add(m)
        return todo

    def stop(self) -> None:
        """Stop every server started here (attached ones keep running)."""
        for pool in self.pools:
            pool.stop()


def error_text(e: BaseException, limit: int = 1500) -> str:
    """``str(e)``, at most ``limit`` characters: its head (a server failure names the server, its
    URL, exit code and log file first) and its tail (the log's last lines)."""
    text = str(e) or type(e).__name__
    if len(text) <= limit:
        return text
    head = limit // 3
    return text[:head] + " … " + text[-(limit - head):]


def token_pieces(tokenizer, ids: list[int], sources: list[str]) -> list[tuple[str, str]]:
    """``(text, source)`` per token by incremental decoding (a character split across tokens goes
    to the token that completes it)."""
    pieces, prev = [], ""
    for i, src in enumerate(sources[:len(ids)]):
        text = tokenizer.decode(ids[:i + 1], skip_special_tokens=True)
        if text.endswith("\ufffd"):
            pieces.append(("", src))
            continue
        pieces.append((text[len(prev):], src))
        prev = text
    return pieces


def stats_markdown(stats: dict, baseline_tps: float | None, is_baseline: bool) -> str:
    """The built-in panels' stats line for a vLLM record, plus per-position acceptance and server time."""
    line = render.stats_line({"new_tokens": stats["new_tokens"], "steps": stats["steps"],
                              "tokens_per_s": stats["tokens_per_s"], "tau": stats["mean_accepted_tokens"],
                              "alpha": stats["acceptance_rate"], "ttft_s": stats["ttft_s"]},
                             baseline_tokens_per_s=baseline_tps, is_baseline=is_baseline,
                             finish_reason=stats["finish_reason"])
    if stats.get("proposed_at"):
        rates = [a / p if p else 0.0 for a, p in zip(stats["accepted_at"], stats["proposed_at"])]
        line += " · per position " + ", ".join(f"{100 * r:.0f}%" for r in rates[:8])
    if stats.get("alignment") == "per_event":
        why = {"no_metrics": "the server sent no speculative-decoding metrics",
               "summary": "the server sent totals only"}.get(stats.get("alignment_reason"))
        line += (f" · steps estimated from the stream ({why}: start it with --per-request-spec-decode-metrics "
                 "detailed)" if why else " · steps estimated from the stream (vLLM's per-step metrics did not "
                 "line up with its events)")
    if stats.get("server_generation_s") is not None:
        line += f" · server {stats['server_generation_s'] + (stats.get('server_ttft_s') or 0):.2f} s"
    return line


def lossless_badge(base: dict, stats: dict) -> str:
    """Badge comparing a method's output with vLLM's baseline (near-ties classified as the engine does)."""
    from playground.engine import check_lossless

    check = check_lossless(base["output_ids"], base["margins"], stats["output_ids"])
    if check.matched:
        return render.badge("match", "same tokens as vLLM's baseline")
    where = f"first difference at token {check.position}"
    if check.near_tie:
        return render.badge("near_tie", f"{where}, a near-tie (margin {check.baseline_margin:.2g})")
    return render.badge("mismatch", where)


def deploy_markdown(session: VLLMSession, names: list[str]) -> str:
    """Markdown: the ``vllm serve`` commands that run the ticked methods (and the baseline) on a machine
    of your own, the app command that attaches to them, and what to prepare and copy first
    (:func:`.methods.serve_commands`); methods vLLM cannot serve, and those attached already (their
    servers run), are left out."""
    names = [m for m in dict.fromkeys(["autoregressive", *names]) if m in vm.SUPPORTED and m not in session.attached]
    if not names:
        return "Every ticked method is attached to a server already."
    try:
        plan = vm.serve_commands(names, target=session.target, draft=session.draft, eagle=session.eagle)
    except ValueError as e:
        return f"Cannot write the commands: {html.escape(str(e))}."
    out = []
    if plan.prepare:
        out.append("First, here:\n\n```bash\n" + "\n".join(plan.prepare) + "\n```")
    if plan.folders:
        out.append("Copy these folders to the serving machine (same paths, or edit the commands):"
                   + "".join(f"\n- `{f}`" for f in plan.folders))
    out.append("On the serving machine (a GPU host; vLLM picks its dtype there), each in its own terminal:\n\n"
               "```bash\n" + "\n".join(plan.commands) + "\n```")
    out.append(f"Where the playground runs, attach to them (replace gpu-host):\n\n```bash\n{plan.attach}\n```")
    return "\n\n".join(out)


def stream_methods(endpoints: dict, tokenizer, names: list[str], ids: list[int], sampling: Sampling,
                   eos: list[int], flag: threading.Event, panels: dict, status, run=run_completion):
    """The tab's run: each method of ``names`` in turn on its server, as updates of the tab's components.

    Yields ``{component: value}`` dicts: every panel cleared, then per method its streamed text (at
    least :data:`PUSH_S` between two updates) and, when its answer is complete, the tokens coloured
    by source, its statistics and the lossless badge against the ``autoregressive`` run (the caller
    puts it first). The last update's ``status`` says "done", "stopped during M" / "stopped after M",
    or what went wrong. The stream is pulled in a helper thread (:class:`.run_control.EventPump`), so
    Stop (``flag`` set) is seen within :data:`.run_control.POLL_S` even while no chunk arrives; the
    connection is then cut (:class:`.client.StreamCutter`, at once, or as soon as the server answers),
    which makes vLLM abort the request, and the run's last update holds every chunk the helper thread
    had read when Stop was seen.

    Args:
        endpoints: ``{method: Endpoint}`` of the running servers (a method without one gets a warning).
        tokenizer: the target's tokenizer (token pieces for the coloured spans).
        names: methods in run order, ``autoregressive`` first.
        ids: the prompt's token ids; ``sampling``: the request's sampling; ``eos``: stop token ids.
        flag: the run's stop flag.
        panels: ``{method: (text, stats, badge)}`` components; ``status``: the status component.
        run: :func:`.runner.run_completion` or a stand-in with its signature (``on_open=`` included).
    """
    # Clear every panel: a previous run's text, stats and badge must not sit beside this one's.
    yield {c: v for p in panels.values() for c, v in zip(p, (render.placeholder("not run yet"), "", ""))}
    base, last = None, None
    for m in names:
        if flag.is_set():  # Stop between two methods: the next one is not even asked
            yield {status: render.status_html("stopped", f"stopped after {last}" if last else "stopped")}
            return
        e = endpoints.get(m)
        if e is None:
            yield {status: render.status_html("warning", f"{m}: no server; press Start vLLM servers")}
            continue
        shown, pushed, last_push, final, error = "", "", float("-inf"), None, None
        yield {status: render.status_html("running", f"{m} on vLLM…")}
        if flag.is_set():  # Stop while that update went out: no request
            yield {status: render.status_html("stopped", f"stopped after {last}" if last else "stopped")}
            return
        cutter = StreamCutter()
        steps = EventPump(run(e, m, ids, sampling, eos, on_open=cutter.opened), flag)
        try:
            for step in steps:
                if step is not None and step.done:
                    final = step
                    break
                if step is not None:
                    shown += step.text
                # A text update at most every PUSH_S: one update per token can outrun the page,
                # which then shows text late and takes Stop late.
                if shown != pushed and time.monotonic() - last_push >= PUSH_S:
                    pushed, last_push = shown, time.monotonic()
                    yield {panels[m][0]: html.escape(shown)}
            if final is None and flag.is_set():  # what had arrived when Stop was seen still counts
                for step in steps.drain():
                    if step.done:
                        final = step
                    else:
                        shown += step.text
            elif final is None:
                raise VLLMError("the stream ended without its answer")
        except Exception as err:  # noqa: BLE001  (never let a run take the server down)
            error = err
        finally:  # before any further update: a read blocked on a quiet stream returns now, vLLM aborts
            steps.close()
            if final is None:
                cutter.cut()
            else:
                cutter.release()
        if error is not None:
            if not isinstance(error, VLLMError):
                log.error("vLLM tab run of %s failed", m, exc_info=error)
            yield {panels[m][0]: html.escape(shown),
                   status: render.status_html("error", f"{m}: {error}")}
            return
        if final is None:  # stopped mid-answer: the text received and "stopped", as the run's last update
            yield {panels[m][0]: html.escape(shown),
                   status: render.status_html("stopped", f"stopped during {m}")}
            return
        stats, last = final.stats, m
        pieces = token_pieces(tokenizer, stats["output_ids"], final.sources)
        base = stats if m == "autoregressive" else base
        yield {panels[m][0]: render.token_spans(pieces),
               panels[m][1]: stats_markdown(stats, base["tokens_per_s"] if base else None, m == "autoregressive"),
               panels[m][2]: "" if m == "autoregressive" or base is None else lossless_badge(base, stats)}
    yield {status: render.status_html("done", "done")}


HOLD_PANELS_JS = """() => { const row = document.getElementById("vllm-panels");
    if (row) row.style.minHeight = row.offsetHeight + "px"; return []; }"""
"""Browser code run on Run: the panels' row keeps at least its present height during the run."""
RELEASE_PANELS_JS = """() => { const row = document.getElementById("vllm-panels");
    if (row) row.style.minHeight = ""; return []; }"""
"""Browser code run when the run has ended (the run handler never raises: it ends with an error
status instead, so this step always follows): the row takes its content's height again."""


def initial_status(session: VLLMSession, installed: bool) -> str:
    """The tab's status line before anything is pressed: the attached servers, else whether servers can be
    started here (without vLLM installed, Start and Run would only fail: say so before they are pressed)."""
    if session.attached:
        return render.status_html("done", "attached: " + ", ".join(session.attached))
    if not installed:
        return render.status_html("warning", "vLLM is not installed on this machine, so no server can be started "
                                             "here: run scripts/setup.sh --vllm, or start the app with --vllm-url "
                                             "NAME=URL to attach to running servers")
    return render.status_html("done", "servers not started")


def build(session: VLLMSession, engine) -> None:
    """Lay out the vLLM tab inside the current Blocks/Tab (``engine`` builds the prompts: its
    tokenizer and chat template, as the built-in panels use)."""
    methods = session.methods()
    gr.Markdown("Every method on its own vLLM server. " + html.escape(TIMING.capitalize()) + ".")
    with gr.Row():
        chosen = gr.CheckboxGroup([(method_label(m), m) for m in methods],  # page names
                                  value=[m for m in methods if m in vm.SUPPORTED], label="Methods",
                                  elem_id="vllm-methods")
        start = gr.Button("Start vLLM servers", elem_id="vllm-start")
    with gr.Accordion("Deploy these methods on vLLM servers of your own", open=False):
        deploy = gr.Markdown(deploy_markdown(session, [m for m in methods if m in vm.SUPPORTED]), elem_id="vllm-deploy")
    chosen.change(lambda names: deploy_markdown(session, names), [chosen], [deploy], api_visibility="private")
    status = gr.HTML(initial_status(session, vllm_available()), elem_id="vllm-status")
    prompt = gr.Textbox(label="Prompt", lines=3, elem_id="vllm-prompt")
    max_new = gr.Slider(1, MAX_NEW_TOKENS, value=96, step=1, label="Max new tokens",
                        elem_id="vllm-max-new")
    with gr.Row():
        run = gr.Button("Run on vLLM", variant="primary", elem_id="vllm-run")
        stop = gr.Button("Stop", elem_id="vllm-stop", interactive=False)
    panels = {}
    with gr.Row(elem_id="vllm-panels"):
        for m in methods:
            with gr.Column(min_width=220):
                gr.Markdown(f"**{m}**")
                # The Playground's token box (its wrapper and CSS in the template), without its fixed
                # height: Gradio's autoscroll without one scrolls the whole page, moving Stop.
                panels[m] = (gr.HTML(render.placeholder("not run yet"), elem_id=f"vllm-panel-{m}",
                                     html_template='<div class="tokens">${value}</div>',
                                     css_template=render.TOKENS_CSS),
                             gr.Markdown("", elem_id=f"vllm-stats-{m}"), gr.HTML("", elem_id=f"vllm-badge-{m}"))
    outputs = [status] + [c for p in panels.values() for c in p]

    def start_servers(names) -> tuple[bool, str]:
        """Make the servers of ``names`` and the baseline ready; ``(ok, status HTML)``."""
        from playground.bench.runner import WARMUP_PROMPT

        try:
            endpoints = session.ready(list(dict.fromkeys(["autoregressive"] + list(names))),
                                      engine.encode_prompt(WARMUP_PROMPT), list(engine.target.eos_token_ids))
        except Exception as e:  # noqa: BLE001  (a load or export error too: the page says what went wrong)
            if not isinstance(e, (VLLMServerError, VLLMError, ValueError)):
                log.error("starting vLLM servers failed", exc_info=e)
            return False, render.status_html("error", error_text(e))
        return True, render.status_html("done", "servers ready: " + ", ".join(
            f"{m} at {e.url} (vLLM {e.version})" for m, e in endpoints.items()))

    def starting(names) -> str | None:
        """The status while servers start, or None when every one needed is ready."""
        missing = session.missing(["autoregressive"] + list(names))
        if not missing:
            return None
        return render.status_html("running", "starting vLLM servers for " + ", ".join(missing)
                                  + " (about a minute or two on a CPU)…")

    def on_start(names):
        note = starting(names)
        if note:
            yield note
        yield start_servers(names)[1]

    def on_run(request: gr.Request, names, text, n):
        key = getattr(request, "session_hash", None)
        flag = STOPS.flag(key)
        try:
            yield from _run(names, text, n, flag)
        # Never raise: the page says what went wrong (an error would also skip the step after the
        # run that re-enables Run and releases the panels' row).
        except Exception as e:  # noqa: BLE001
            log.error("vLLM tab run failed", exc_info=e)
            yield {status: render.status_html("error", f"{type(e).__name__}: {e}")}
        finally:
            STOPS.release(key, flag)

    def _run(names, text, n, flag):
        names = ["autoregressive"] + [m for m in names if m != "autoregressive"]
        try:
            ids = engine.encode_prompt(text)
        except ValueError as e:
            yield {status: render.status_html("warning", str(e))}
            return
        if flag.is_set():  # stopped while queued behind another run: start nothing
            yield {status: render.status_html("stopped", "stopped")}
            return
        note = starting(names)
        if note:
            yield {status: note}
        ok, message = start_servers(names)  # waits while another Start or Run is starting servers
        if not ok:
            yield {status: message}
            return
        if flag.is_set():  # Stop pressed while the servers started (it cannot cut a start short)
            yield {status: render.status_html("stopped", "stopped: the servers are ready; nothing was asked")}
            return
        yield from stream_methods(dict(session.endpoints), engine.target.tokenizer, names, ids,
                                  Sampling(int(n)), list(engine.target.eos_token_ids), flag, panels, status)

    # One at a time, across browser sessions: two runs at once on the same servers would be batched
    # together by vLLM and time each other.
    start.click(on_start, [chosen], [status], concurrency_limit=1, concurrency_id="vllm")

    def arm(request: gr.Request):
        STOPS.arm(getattr(request, "session_hash", None))
        return gr.Button(interactive=False), gr.Button(interactive=True)

    def on_stop(request: gr.Request):
        STOPS.stop(getattr(request, "session_hash", None))

    # As on the Playground (see run_control): Stop sets a flag the run checks after every chunk and
    # every POLL_S while none arrives, so the run's own last update says "stopped" and no text follows it.
    # The panels' row keeps its height while a run is in flight: the run's first update clears the
    # last run's text, stats and badges, and a page scrolled to its end would then scroll up by what
    # it lost, moving Stop away from under the pointer (a click then misses it).
    run.click(arm, None, [run, stop], api_visibility="private", queue=False, js=HOLD_PANELS_JS).then(
        on_run, [chosen, prompt, max_new], outputs, concurrency_limit=1, concurrency_id="vllm").then(
        lambda: (gr.Button(interactive=True), gr.Button(interactive=False)), None, [run, stop],
        api_visibility="private", queue=False, js=RELEASE_PANELS_JS)
    stop.click(on_stop, None, None, api_visibility="private", queue=False)
