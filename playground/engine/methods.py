"""Every method, registered by importing its module (each module calls ``registry.register``).

(The drafters branch's copy: only the new training-free methods; the lead's refactor lists the
others above them.)
"""

# isort: off
from . import suffix  # noqa: F401  (each import registers its method)
from . import recycling  # noqa: F401
from . import mixture  # noqa: F401
# isort: on
