"""Every method, registered by importing its module (each module calls ``registry.register``).

Adding a method means adding its module and one line here; the order of these lines is the order
of the methods on the page and in the benchmark (the baseline first).
"""

# isort: off
from . import autoregressive  # noqa: F401  (each import registers its method)
from . import prompt_lookup  # noqa: F401
from . import draft_model  # noqa: F401
from . import lookahead  # noqa: F401
from . import medusa  # noqa: F401
# isort: on
from .registry import (BASELINE, METHODS, MethodInfo, MethodSpec, is_lossless, lossless_check_applies,  # noqa: E402
                       source_labels)

__all__ = ["BASELINE", "METHODS", "MethodInfo", "MethodSpec", "is_lossless", "lossless_check_applies",
           "source_labels"]
