"""Running a benchmark: the run checks, the warm-up, the loop over (question, turn, method), the
progress bar. The command line, the page's Benchmark tab and the training tools all run through
:func:`prepare` and :class:`Benchmark`, so the checks exist once.

Order and timing
    For each (question, turn) every method runs once before the next turn, **round-robin**: one
    step of each method in turn, the autoregressive baseline first, as the page's side-by-side runs
    step them, so a change in the machine's speed hits every method alike. Each method's clock
    counts only its own steps (prefill included), as the engine measures it, and each record's
    ``steady_steps`` is that time in the baseline's contemporaneous decoding steps
    (:mod:`.weather`), which the summary reads speedups from. Runners that cannot step (a
    backend's whole-answer call) run one after another instead, as does ``round_robin=False``
    (the CLI's ``--sequential``). :meth:`Benchmark.warm_up` runs short untimed generations first.
    Multi-turn questions run turn after turn; each method sees its *own* earlier answers.

Checks (:func:`check_specs` without models; :func:`prepare` once they are loaded): every
method's settings are in range, the loaded models can run it (a draft for draft_model, heads
for medusa), its drafter builds with these settings (a Medusa tree no deeper than the heads,
draft_model's ``medusa_heads`` proposer with heads for the draft), ``max_new_tokens`` leaves
room for a prompt in the target's context, and at least one question's first turn fits.
Questions that do not fit are skipped during the run, with a note.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Generator, Iterator

from .errors import BenchError
from .questions import Question
from .records import measured_fields
from .weather import StepTime, steady_steps

WARMUP_PROMPT = "Write two sentences about the sea. The sea is"
WARMUP_TOKENS = 16
TICK_S = 0.5
"""During a round-robin (question, turn), :func:`iter_runs` yields a ``"tick"`` at most this often (seconds),
so a consumer that closes it (the page's Stop) stops within about this long."""
PAGE_LABELS = {"max_new_tokens": "max new tokens", "tree": "the tree"}
"""How the checks' messages name the settings to change, by default (the page's words); the
command line passes its flags instead (``--max-new-tokens``, ``--tree``)."""


# ----- checks ----------------------------------------------------------------------------------
def order_methods(names: list[str]) -> list[str]:
    """Check method names and put the baseline first (added when missing).

    Raises:
        BenchError: no name, a name twice, or a name not in the engine's ``METHODS``.
    """
    from playground.engine import BASELINE, METHODS

    if not names:
        raise BenchError("no method is chosen; available methods: " + ", ".join(METHODS))
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise BenchError(f"unknown method{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                         f"available methods: {', '.join(METHODS)}")
    if len(set(names)) != len(names):
        raise BenchError(f"a method is chosen twice: {', '.join(names)}")
    return [BASELINE] + [m for m in names if m != BASELINE]


def check_specs(specs: list) -> None:
    """Check every method's settings (``MethodSpec.checked_params``); needs no model.

    Raises:
        BenchError: the engine's message (unknown method or knob, a value out of range).
    """
    try:
        for s in specs:
            s.checked_params()
    except ValueError as e:
        raise BenchError(str(e)) from None


def check_runnable(engine, specs: list, max_new_tokens: int, questions: list[Question],
                   labels: dict[str, str] | None = None, scope: str | None = None) -> None:
    """Check, once the models are loaded and before any run, everything that needs them.

    That is: the loaded models can run every method (``Engine.unavailable_reason``);
    ``max_new_tokens`` leaves room for a prompt in the target's context; every method builds its
    drafter with these settings and models; and at least one question's first turn fits the
    context with ``max_new_tokens``. Building a drafter runs no model, except that Medusa's
    ``auto`` tree is measured here, once, rather than in the first run.

    Args:
        engine: a loaded ``playground.engine.Engine``.
        specs: the ``MethodSpec`` of every method to run.
        max_new_tokens: new tokens per answer.
        questions: the questions to run.
        labels: how messages name ``max_new_tokens`` and ``tree`` (default :data:`PAGE_LABELS`).
        scope: the scope the drafters are built in (:class:`Benchmark`).

    Raises:
        BenchError: naming the setting to change.
    """
    from playground.engine import TreeChoicesError

    name = {**PAGE_LABELS, **(labels or {})}
    max_new = f"{name['max_new_tokens']} {max_new_tokens}"

    for s in specs:
        reason = engine.unavailable_reason(s.name)
        if reason:
            raise BenchError(f"{s.name} cannot run: {reason}")
    target = engine.target
    context = target.context_length
    if max_new_tokens >= context:
        raise BenchError(f"{max_new} leaves no room for the prompt: {target.name}'s context "
                         f"holds {context} tokens, prompt and answer together; use fewer new tokens")
    _check_a_question_fits(engine, questions, max_new_tokens, name, max_new)
    for s in specs:
        try:
            engine.make_drafter(s, scope)
        except TreeChoicesError as e:  # only a custom tree can fail here (presets fit any heads)
            raise BenchError(f"{s.name} cannot run: {name['tree']}: {e}") from None
        except ValueError as e:
            raise BenchError(f"{s.name} cannot run: {e}") from None


def _check_a_question_fits(engine, questions: list[Question], max_new_tokens: int, name: dict, max_new: str) -> None:
    """Raise BenchError naming the largest new-token count that fits when no first prompt fits."""
    target = engine.target
    context = target.context_length
    if not questions:
        return
    shortest = None
    for q in questions:
        try:
            length = len(engine.encode_prompt(q.turns[0]))
        except ValueError:  # longer than the whole context
            continue
        if length + max_new_tokens <= context:
            return
        shortest = length if shortest is None else min(shortest, length)
    longest_ok = context - (shortest if shortest is not None else context)
    hint = (f"the shortest first prompt is {shortest} tokens, so use {name['max_new_tokens']} {longest_ok} or fewer"
            if longest_ok >= 1 else "every first prompt alone fills the context; choose shorter questions")
    raise BenchError(f"no question fits {target.name}'s context of {context} tokens with {max_new}: {hint}")


# ----- one method on one prompt -------------------------------------------------------------------
def run_method(engine, prompt_ids: list[int], spec, settings, scope: str | None = None) -> dict:
    """Run one method to the end; return the measured part of its record (see :mod:`.records`)."""
    return finish(step_method(engine, prompt_ids, spec, settings, scope))


def finish(gen: Generator):
    """Run a generator to its end and return its return value (what it yields is dropped)."""
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value


def step_method(engine, prompt_ids: list[int], spec, settings, scope: str | None = None
                ) -> Generator[float, None, dict]:
    """One method on one prompt, a step at a time: yields each step's duration in seconds (the first
    holds the prefill) and returns the measured part of its record (see :mod:`.records`). ``scope``:
    whose learned state it reads and adds to (``Engine.run``)."""
    from playground.engine import RunOutput

    out = RunOutput(spec.name, spec.params)
    before = 0.0
    for event in engine.run_one(prompt_ids, spec, settings, scope=scope):
        out.add(event)
        yield event.stats.elapsed_s - before
        before = event.stats.elapsed_s
    stats = out.last.stats
    return {**measured_fields(stats.as_dict(), out.ids, out.text, out.margins, out.last.finish_reason),
            "accepted_at": list(stats.accepted_at), "proposed_at": list(stats.proposed_at)}


@dataclass(frozen=True)
class Runner:
    """One method as the benchmark loop sees it: a name, its params, ``run(prompt_ids) -> measured
    fields`` (see :func:`run_method` for the fields), and, where it can go a step at a time,
    ``steps(prompt_ids)``: a generator of step durations returning the same fields (see
    :func:`step_method`), which round-robin runs use."""

    name: str
    params: dict
    run: Callable[[list[int]], dict]
    steps: Callable[[list[int]], Generator[float, None, dict]] | None = None


def engine_runner(engine, spec, settings, scope: str | None = None) -> Runner:
    """A :class:`Runner` for an engine method (``spec`` is a ``MethodSpec``) learning in ``scope``
    (``Engine.run``); it can step."""
    return Runner(spec.name, engine.with_defaults(spec).checked_params(),
                  lambda ids: run_method(engine, ids, spec, settings, scope),
                  lambda ids: step_method(engine, ids, spec, settings, scope))


def round_robin(runners: list[Runner], prompts: dict[str, list[int]],
                log: list[StepTime] | None = None) -> Generator[None, None, dict[str, dict]]:
    """Every runner on its prompt, one step each in turn, the first runner being the baseline.

    Yields None about every :data:`TICK_S` seconds (closing the generator there drops the round), and
    returns ``{name: measured fields + "steady_steps"}``: each method's time in the baseline's
    contemporaneous decoding steps (:func:`.weather.steady_steps`). Every step's
    :class:`~.weather.StepTime` is appended to ``log`` when one is given.
    """
    streams: dict[str, Generator] = {}
    fields: dict[str, dict] = {}
    log = [] if log is None else log
    started: set[str] = set()
    last_tick = time.perf_counter()
    try:
        for r in runners:
            streams[r.name] = r.steps(prompts[r.name])
        while streams:
            for name, stream in list(streams.items()):
                try:
                    seconds = next(stream)
                except StopIteration as done:
                    fields[name] = done.value
                    del streams[name]
                    continue
                now = time.perf_counter()
                log.append(StepTime(name, now, seconds, first=name not in started))
                started.add(name)
                if now - last_tick >= TICK_S:
                    last_tick = now
                    yield None
    finally:  # stopped or failed: every unfinished run ends now (its caches freed), not when collected
        for stream in streams.values():
            stream.close()
    steady = steady_steps(log, runners[0].name)
    return {name: {**f, "steady_steps": steady.get(name, 0.0)} for name, f in fields.items()}


# ----- the loop -------------------------------------------------------------------------------------
def iter_runs(engine, questions: list[Question], runners: list[Runner], max_new_tokens: int,
              extra: dict | None = None, round_robin_runs: bool = True) -> Iterator[tuple[str, object, int]]:
    """Run every method on every (question, turn), as a generator.

    ``engine`` only builds prompts (chat template, context check). Each method keeps its own
    conversation per question: turn t's prompt holds the earlier user turns and that method's
    own earlier answers. A (question, turn) whose prompt does not fit the context for some
    method is skipped for all methods, and so are the question's later turns. With
    ``round_robin_runs`` and every runner able to step, each (question, turn) runs every method
    round-robin (:func:`round_robin`; the first runner is the baseline) and its records carry
    ``steady_steps``; otherwise each method runs to the end before the next.

    Yields:
        ``("record", record, 1)`` after each run (round-robin: every method's, in runner order,
        once the (question, turn) is done), ``("skip", message, runs_skipped)`` when a (question,
        turn) and the question's later turns are skipped, and, during a round-robin (question,
        turn), ``("tick", {"question_id", "turn"}, 0)`` about every :data:`TICK_S` seconds.
        Closing the generator stops after the current run, or at a tick, dropping that
        (question, turn)'s records (a consumer that must not keep part of a round-robin turn
        holds its records until it has all of them).
    """
    context = engine.target.context_length
    stepped = round_robin_runs and all(r.steps is not None for r in runners)
    for q in questions:
        history: dict[str, list[dict]] = {r.name: [] for r in runners}
        for turn, user in enumerate(q.turns):
            prompts = {}
            try:
                for r in runners:
                    ids = engine.encode_prompt(history[r.name] + [{"role": "user", "content": user}])
                    if len(ids) + max_new_tokens > context:
                        raise ValueError(f"the prompt is {len(ids)} tokens; with max_new_tokens={max_new_tokens} "
                                         f"it exceeds the context of {context}")
                    prompts[r.name] = ids
            except ValueError as e:
                yield "skip", f"skipping question {q.question_id} from turn {turn}: {e}", \
                    (len(q.turns) - turn) * len(runners)
                break
            measured = {}
            if stepped:
                rounds = round_robin(runners, prompts)
                try:
                    while True:
                        try:
                            next(rounds)
                        except StopIteration as done:
                            measured = done.value
                            break
                        yield "tick", {"question_id": q.question_id, "turn": turn}, 0
                finally:
                    rounds.close()
            for r in runners:
                rec = {"question_id": q.question_id, "category": q.category, "turn": turn, "method": r.name,
                       "params": r.params, "prompt_tokens": len(prompts[r.name])}
                rec.update(measured[r.name] if stepped else r.run(prompts[r.name]))
                rec.update(extra or {})
                history[r.name] += [{"role": "user", "content": user},
                                    {"role": "assistant", "content": rec["output_text"]}]
                yield "record", rec, 1


class Progress:
    """A stderr progress bar (tqdm, which transformers already depends on) with a plain fallback."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True, mininterval=0.5)
            except ImportError:
                pass

    def update(self, text: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
        elif self.enabled:
            print(f"[{self.done}/{self.total}] {text}", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        """Show ``text`` beside the bar without counting a run (plain output: nothing)."""
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_all(engine, questions: list[Question], runners: list[Runner], max_new_tokens: int,
            write: Callable[[dict], None], progress: Progress | None = None, extra: dict | None = None,
            round_robin_runs: bool = True) -> list[dict]:
    """:func:`iter_runs` to the end: call ``write(record)`` after each run, report skips and
    progress on ``progress`` (or stderr), and return the records."""
    records = []
    for kind, item, runs in iter_runs(engine, questions, runners, max_new_tokens, extra, round_robin_runs):
        if kind == "tick":
            if progress:
                progress.note(f"q {item['question_id']} t{item['turn']}: every method in turn")
            continue
        if kind == "skip":
            if progress:
                progress.write(item)
                for _ in range(runs):
                    progress.update("skipped")
            else:
                print(item, file=sys.stderr)
            continue
        write(item)
        records.append(item)
        if progress:
            progress.update(f"q {item['question_id']} t{item['turn']} {item['method']} "
                            f"{item['tokens_per_s']:.1f} tok/s")
    return records


# ----- a prepared benchmark -----------------------------------------------------------------------
@dataclass
class Benchmark:
    """A checked benchmark, ready to run (build it with :func:`prepare`).

    Attributes:
        engine: the loaded engine; questions: what to run; specs: the methods, baseline first;
        settings: the ``GenerationSettings`` of every run; extra: fields added to every record
        (``temperature``, ``dtype``, ``target``, and ``stop_strings`` when there are some);
        round_robin: step the methods round-robin on each (question, turn) (see :func:`iter_runs`);
        scope: whose learned state the runs read and add to (``Engine.run``; the page gives each
        benchmark a scope of its own, dropped when it ends); None: the unscoped state.
    """

    engine: object
    questions: list[Question]
    specs: list
    settings: object
    extra: dict = field(default_factory=dict)
    labels: dict = field(default_factory=lambda: dict(PAGE_LABELS))
    round_robin: bool = True
    scope: str | None = None

    @property
    def total_runs(self) -> int:
        """Runs the benchmark makes when no question is skipped: turns x methods."""
        return sum(len(q.turns) for q in self.questions) * len(self.specs)

    def runners(self) -> list[Runner]:
        return [engine_runner(self.engine, s, self.settings, self.scope) for s in self.specs]

    def warm_up(self, rounds: int = 1) -> None:
        """Untimed short generations of every method (kernel selection, allocator, lazy imports).

        Raises:
            BenchError: the engine refused the warm-up (its message).
        """
        from dataclasses import replace

        if rounds < 0:
            raise BenchError(f"--warmup must be at least 0, got {rounds}")
        short = replace(self.settings, max_new_tokens=min(WARMUP_TOKENS, self.settings.max_new_tokens))
        try:
            ids = self.engine.encode_prompt(WARMUP_PROMPT)
            for _ in range(rounds):
                for s in self.specs:
                    for _event in self.engine.run_one(ids, s, short, scope=self.scope):
                        pass
        except ValueError as e:
            raise BenchError(f"warm-up failed: {e}") from None
        # Methods that learn across runs (suffix caches, recycling tables, acceptance calibration) forget
        # the warm-up output: the timed runs see only earlier questions' outputs of the same method.
        self.engine.forget_learned(self.scope)

    def iter(self) -> Iterator[tuple[str, object, int]]:
        """:func:`iter_runs` over this benchmark (under ``torch.inference_mode``)."""
        import torch

        with torch.inference_mode():
            yield from iter_runs(self.engine, self.questions, self.runners(), self.settings.max_new_tokens,
                                 self.extra, self.round_robin)

    def run(self, write: Callable[[dict], None], progress: Progress | None = None) -> list[dict]:
        """:func:`run_all` over this benchmark (under ``torch.inference_mode``).

        Raises:
            BenchError: the engine refused a run (its message about a setting or a prompt), or
                every question was skipped.
        """
        import torch

        try:
            with torch.inference_mode():
                records = run_all(self.engine, self.questions, self.runners(), self.settings.max_new_tokens,
                                  write, progress, self.extra, self.round_robin)
        except ValueError as e:  # the engine's message about a setting or a prompt (TreeChoicesError is one)
            raise BenchError(f"run failed: {e}") from None
        if not records:
            target = self.engine.target
            raise BenchError(f"no question could be run: each was skipped because its prompt with "
                             f"{self.labels['max_new_tokens']} {self.settings.max_new_tokens} exceeds {target.name}'s context of "
                             f"{target.context_length} tokens; use fewer new tokens or shorter questions")
        return records


def prepare(engine, questions: list[Question], specs: list, settings,
            labels: dict[str, str] | None = None, scope: str | None = None) -> Benchmark:
    """Run every check (:func:`check_specs`, :func:`check_runnable`) and return the benchmark.

    Args:
        engine: a loaded ``Engine``; questions: see :mod:`.questions`; specs: ``MethodSpec``
            list, the baseline first (see :func:`order_methods`); settings: ``GenerationSettings``;
        labels: see :func:`check_runnable`; scope: see :class:`Benchmark`.

    Raises:
        BenchError: naming what to change.
    """
    check_specs(specs)
    labels = {**PAGE_LABELS, **(labels or {})}
    check_runnable(engine, specs, settings.max_new_tokens, questions, labels, scope)
    target = engine.target
    extra = {"temperature": settings.sampling.temperature, "dtype": str(target.dtype).removeprefix("torch."),
             "target": target.name}
    stops = list(getattr(settings, "stop_strings", None) or ())
    if stops:
        extra["stop_strings"] = stops
    return Benchmark(engine, list(questions), list(specs), settings, extra, labels, scope=scope)


# ----- the machine ----------------------------------------------------------------------------------
def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) CPU time of the whole machine in clock ticks, from Linux's /proc/stat; None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def other_cpu_load(seconds: float = 0.5) -> float | None:
    """Cores kept busy by other processes, measured over ``seconds`` while this one sleeps (Linux); None
    where it cannot be measured. A benchmark's threads compete with them, and on a CPU a thread that
    loses its core stalls the others at every synchronisation, so timings become slow and noisy."""
    first = _cpu_times()
    if first is None:
        return None
    time.sleep(seconds)
    second = _cpu_times()
    if second is None or second[1] <= first[1]:
        return None
    return (second[0] - first[0]) / (second[1] - first[1]) * (os.cpu_count() or 1)
