"""Named limits shared by the engine's argument checks and the UI's sliders.

Every knob a user can set is described once here, as a :class:`Knob`: its name,
bounds, default and step. The API checks values with :meth:`Knob.check` (which
raises ``ValueError`` naming the bound, e.g. ``k must be in [1, 16], got 0``) and
the UI builds its sliders from the same objects, so the two can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_SPECULATIVE_TOKENS = 16
"""Largest K (gamma): speculative tokens a draft model proposes per step."""

MAX_PROMPT_LOOKUP_NGRAM = 8
"""Largest n-gram size prompt lookup tries to match."""

MAX_PROMPT_LOOKUP_TOKENS = 16
"""Largest number of tokens prompt lookup copies after a match."""

MAX_LOOKAHEAD_WINDOW = 20
"""Largest Lookahead window W (Jacobi positions per level)."""

MAX_LOOKAHEAD_NGRAM = 8
"""Largest Lookahead n-gram size N (the window holds N - 1 levels)."""

MAX_LOOKAHEAD_GUESS_SET = 20
"""Largest Lookahead guess set size G (n-grams verified per step)."""

MAX_NEW_TOKENS = 2048
"""Largest number of new tokens one run may generate."""

MAX_TEMPERATURE = 2.0
MIN_SAMPLING_TEMPERATURE = 1e-3
"""Smallest temperature above 0 (0 is greedy): logits divided by less overflow float32."""
MAX_TOP_K = 1000

MEDUSA_TOP_K = 10
"""Candidates each Medusa head offers per step (its top-k tokens): every index in a tree path
must be below this (the reference implementation's TOPK)."""

MAX_MEDUSA_TREE_NODES = 64
"""Largest Medusa candidate tree (nodes, root excluded); the reference's biggest tree has 63."""

MAX_MEDUSA_HEADS = 16
"""Most Medusa heads a checkpoint may hold (published ones have 3 to 5)."""


@dataclass(frozen=True)
class Knob:
    """One bounded numeric setting.

    Attributes:
        name: the keyword used by the API (``k``, ``max_ngram_size``, ...).
        label: the text shown next to the UI slider.
        minimum, maximum: inclusive bounds.
        default: the value used when the caller gives none.
        step: the slider step (1 for integers).
        integer: whether the value must be an integer.
        info: one line of help for the UI.
    """

    name: str
    label: str
    minimum: float
    maximum: float
    default: float
    step: float = 1
    integer: bool = True
    info: str = ""

    def check(self, value) -> int | float:
        """Return ``value`` converted to int/float, or raise ``ValueError`` naming the bound.

        Raises:
            ValueError: ``"<name> must be in [min, max], got <value>"`` when out of range (infinities
                included), ``"<name> must be an integer, got <value>"``, or ``"<name> must be a
                number, got <value>"`` (booleans are not numbers).
        """
        if isinstance(value, bool):
            raise ValueError(f"{self.name} must be a number, got {value!r}")
        if not isinstance(value, (int, float)):
            try:
                value = float(value)
            except (TypeError, ValueError, OverflowError):
                raise ValueError(f"{self.name} must be a number, got {value!r}") from None
        if value != value:  # NaN
            raise ValueError(f"{self.name} must be a number, got NaN")
        if value in (float("inf"), float("-inf")):
            lo = int(self.minimum) if self.integer else self.minimum
            hi = int(self.maximum) if self.integer else self.maximum
            raise ValueError(f"{self.name} must be in [{lo}, {hi}], got {value}")
        if self.integer:
            if float(value) != int(value):
                raise ValueError(f"{self.name} must be an integer, got {value}")
            value = int(value)
        else:
            value = float(value)
        if not (self.minimum <= value <= self.maximum):
            lo = int(self.minimum) if self.integer else self.minimum
            hi = int(self.maximum) if self.integer else self.maximum
            raise ValueError(f"{self.name} must be in [{lo}, {hi}], got {value}")
        return value


@dataclass(frozen=True)
class ChoiceKnob:
    """One setting chosen by name from a few options (a dropdown in the UI).

    Attributes:
        name, label, info: as for :class:`Knob`.
        choices: the named options; default: one of them.
        parse: when given, values that are not a named option are passed to it and its result
            is the checked value (it raises ``ValueError`` with the reason); e.g. a custom
            Medusa tree given as JSON. None: only the named options are allowed.
        custom_label: what a custom value is, for messages and the UI (``"a JSON list of paths"``).
    """

    name: str
    label: str
    choices: tuple[str, ...]
    default: str
    info: str = ""
    parse: object = None  # Callable[[Any], Any] | None (a plain field keeps the dataclass hashable)
    custom_label: str = ""

    def check(self, value):
        """Return a named option as is, else ``parse(value)``.

        Raises:
            ValueError: ``"<name> must be one of a, b, c, got <value>"`` (naming the custom form
                when one is allowed), or the parser's own message.
        """
        if isinstance(value, str) and value.strip() in self.choices:
            return value.strip()
        if self.parse is None or value is None or (isinstance(value, str) and not value.strip()):
            extra = f" or {self.custom_label}" if self.parse is not None else ""
            raise ValueError(f"{self.name} must be one of {', '.join(self.choices)}{extra}, got {value!r}")
        return self.parse(value)


# Generation settings -------------------------------------------------------
MAX_NEW_TOKENS_KNOB = Knob("max_new_tokens", "Max new tokens", 1, MAX_NEW_TOKENS, 128,
                           info="Generation stops after this many new tokens (or at EOS).")
TEMPERATURE_KNOB = Knob("temperature", "Temperature", 0.0, MAX_TEMPERATURE, 0.0, step=0.05,
                        integer=False, info="0 = greedy decoding (lossless methods must match the baseline).")
TOP_P_KNOB = Knob("top_p", "Top-p", 0.01, 1.0, 1.0, step=0.01, integer=False,
                  info="Nucleus sampling: keep the smallest set of tokens with this much probability.")
TOP_K_KNOB = Knob("top_k", "Top-k", 0, MAX_TOP_K, 0, info="Keep the k most likely tokens; 0 = off.")
MAX_REPETITION_PENALTY = 3.0
"""Largest repetition penalty (1.0 = off; published generation configs use 1.0 to 1.3)."""
REPETITION_PENALTY_KNOB = Knob("repetition_penalty", "Repetition penalty", 0.5, MAX_REPETITION_PENALTY, 1.0,
                               step=0.05, integer=False,
                               info="Every token already in the prompt or the output has its logit divided by this "
                                    "(multiplied when negative) before sampling; 1 = off. Starts at the model's own "
                                    "default (its generation config).")
SEED_KNOB = Knob("seed", "Seed", 0, 2**31 - 1, 0,
                 info="Seed of the sampling generator. The same seed repeats the baseline's sample; a method "
                      "that learns across runs (the budget's estimates, draft gates, suffix and recycling "
                      "caches) draws its random numbers in another order the next time, so its sample can "
                      "differ, still from the target's distribution.")

# Method knobs ---------------------------------------------------------------
K_KNOB = Knob("k", "Speculative tokens K", 1, MAX_SPECULATIVE_TOKENS, 4,
              info="Tokens the draft model proposes per step (gamma).")
PROMPT_LOOKUP_NGRAM_KNOB = Knob("max_ngram_size", "Max n-gram size", 1, MAX_PROMPT_LOOKUP_NGRAM, 3,
                                info="Longest suffix n-gram searched for in the prompt and output so far.")
PROMPT_LOOKUP_TOKENS_KNOB = Knob("num_pred_tokens", "Tokens to propose", 1, MAX_PROMPT_LOOKUP_TOKENS, 10,
                                 info="Tokens copied after the match and proposed for verification.")

LOOKAHEAD_WINDOW_KNOB = Knob("window", "Window W", 1, MAX_LOOKAHEAD_WINDOW, 2,
                             info="Lookahead: Jacobi positions guessed in parallel per level.")
LOOKAHEAD_NGRAM_KNOB = Knob("ngram_size", "N-gram size N", 2, MAX_LOOKAHEAD_NGRAM, 3,
                            info="Lookahead: n-gram length; the window keeps N - 1 Jacobi levels.")
LOOKAHEAD_GUESS_KNOB = Knob("guess_set_size", "Guess set size G", 1, MAX_LOOKAHEAD_GUESS_SET, 3,
                            info="Lookahead: at most G n-grams per key token, all verified in one pass.")
LOOKAHEAD_KNOBS = (LOOKAHEAD_WINDOW_KNOB, LOOKAHEAD_NGRAM_KNOB, LOOKAHEAD_GUESS_KNOB)

MIN_POSTERIOR = 0.01
"""Smallest typical-acceptance threshold and alpha: at 0 every candidate would be accepted (p(x) > 0),
whatever the target thinks of it."""
POSTERIOR_THRESHOLD_KNOB = Knob("posterior_threshold", "Posterior threshold", MIN_POSTERIOR, 1.0, 0.09, step=0.01,
                                integer=False, info="Medusa typical acceptance: a drafted token x is accepted when "
                                "the target gives it probability p(x) > min(threshold, alpha * exp(-entropy)). "
                                "Higher is stricter (closer to the target's own choice); lower accepts more, "
                                "less likely tokens.")
POSTERIOR_ALPHA_KNOB = Knob("posterior_alpha", "Posterior alpha", MIN_POSTERIOR, 1.0, 0.3, step=0.01, integer=False,
                            info="Medusa typical acceptance: scales exp(-entropy) of the target's distribution, so "
                                 "where the target is unsure (high entropy) less probable tokens pass. Lower "
                                 "accepts more.")

DRAFT_CONFIDENCE_KNOB = Knob("confidence", "Confidence threshold", 0.0, 1.0, 0.0, step=0.05, integer=False,
                             info="Dynamic draft length: stop drafting when the draft's top next-token probability "
                                  "falls below this (0 = always draft K). Where verifying more tokens costs much "
                                  "more than one (CPUs), unconfident steps then cost a plain decoding step.")
DRAFT_PROPOSER_KNOB = ChoiceKnob(
    "proposer", "Proposer", ("model", "medusa_heads"), "model",
    info="Draft model: the draft model drafts K tokens, one forward pass each. Medusa heads on the draft: the "
         "draft's next token plus its Medusa heads' tokens, from one draft forward pass (needs heads trained on "
         "the draft).")
MEDUSA_ACCEPTANCE_KNOB = ChoiceKnob(
    "acceptance", "Acceptance", ("exact", "typical"), "exact",
    info="exact: the target's own rule (greedy argmax match, or speculative sampling): lossless. "
         "typical: Medusa's typical acceptance, faster but the output may differ from the target's.")

MAX_EAGLE_DEPTH = 10
"""Deepest EAGLE draft tree (draft levels per step)."""
MAX_EAGLE_TOP_K = 16
"""Most children an EAGLE tree node is expanded with."""
MAX_EAGLE_TOTAL_TOKENS = 64
"""Most EAGLE tree nodes verified in one step."""


def _total_tokens(value) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ValueError(f"total_tokens must be auto or an integer in [1, {MAX_EAGLE_TOTAL_TOKENS}], "
                         f"got {value!r}") from None
    if not 1 <= n <= MAX_EAGLE_TOTAL_TOKENS:
        raise ValueError(f"total_tokens must be in [1, {MAX_EAGLE_TOTAL_TOKENS}], got {n}")
    return n


EAGLE_DEPTH_KNOB = Knob("depth", "Tree depth", 1, MAX_EAGLE_DEPTH, 4,
                        info="EAGLE: draft levels per step (the deepest token a step can accept, plus the bonus).")
EAGLE_TOP_K_KNOB = Knob("top_k", "Children per node", 1, MAX_EAGLE_TOP_K, 4,
                        info="EAGLE-2: the k best nodes of each level are expanded with their k best children each.")
EAGLE_TOTAL_TOKENS_KNOB = ChoiceKnob(
    "total_tokens", "Tree nodes verified", ("auto",), "auto", parse=_total_tokens,
    custom_label=f"an integer in [1, {MAX_EAGLE_TOTAL_TOKENS}]",
    info="EAGLE-2: verify the best nodes by cumulative draft probability; auto: per step, as many as pay for "
         "their verification on this device's measured cost curve, and draft a level only when it is expected "
         "to pay for itself.")
EAGLE_KNOBS = (EAGLE_DEPTH_KNOB, EAGLE_TOP_K_KNOB, EAGLE_TOTAL_TOKENS_KNOB)

GENERATION_KNOBS = (MAX_NEW_TOKENS_KNOB, TEMPERATURE_KNOB, TOP_P_KNOB, TOP_K_KNOB, SEED_KNOB)

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
"""Values of every ``--dtype`` option and of ``load_model(dtype=...)`` (``auto``: bfloat16 on CUDA,
float32 on CPUs)."""

MAX_STOP_STRINGS = 8
"""Most stop strings one run may have."""
MAX_STOP_STRING_CHARS = 64
"""Longest stop string, in characters."""
