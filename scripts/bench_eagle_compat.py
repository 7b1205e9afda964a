"""Run ``python -m playground.bench`` with the ``eagle`` method added, before the registry-based engine
lands (this branch's bench still reads ``compare.METHODS``). Usage: the bench's own arguments, e.g.

    EAGLE_PARAMS='{"depth": 5, "top_k": 6}' python scripts/bench_eagle_compat.py \\
        --questions spec_bench_dev.jsonl --methods autoregressive,eagle,draft_model,medusa ...

The head is the shipped ``assets/eagle/default`` unless ``EAGLE_HEAD`` names another folder.
Delete this script once ``playground.bench`` knows ``eagle`` (``--eagle``, ``--depth``, ...).
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playground.engine import compare  # noqa: E402
from playground.engine.eagle import DEFAULT_EAGLE_DIR, EagleDrafter, load_eagle, verify_cost_for  # noqa: E402
from playground.engine.eagle import depth_source  # noqa: E402
from playground.engine.limits import MAX_EAGLE_DEPTH  # noqa: E402

PARAMS = json.loads(os.environ.get("EAGLE_PARAMS", "{}"))
HEAD = os.environ.get("EAGLE_HEAD", str(DEFAULT_EAGLE_DIR))

compare.METHODS["eagle"] = compare.MethodInfo(
    "eagle", "EAGLE-3", "EAGLE-3 head, EAGLE-2 dynamic tree.", True, False, (),
    (compare.SOURCE_TARGET,) + tuple(depth_source(d) for d in range(1, MAX_EAGLE_DEPTH + 1)))

_load, _make = compare.Engine.load.__func__, compare.Engine.make_drafter


def load(cls, *args, **kwargs):
    engine = _load(cls, *args, **kwargs)
    engine.eagle = load_eagle(HEAD, engine.target)
    return engine


def make_drafter(self, spec):
    if spec.name == "eagle":
        cost = verify_cost_for(self.target_lm) if PARAMS.get("total_tokens", "auto") == "auto" else None
        return EagleDrafter(self.eagle, verify_cost=cost, **PARAMS)
    return _make(self, spec)


compare.Engine.load = classmethod(load)
compare.Engine.make_drafter = make_drafter

if __name__ == "__main__":
    from playground.bench import main
    sys.exit(main(sys.argv[1:]))
