"""Every step ``ctx bootstrap`` runs after the root ABI (SPEC R-5).

Each layer registers its own step with :func:`cortexfs.storage.register_bootstrap_step` when
it is imported; importing this module imports them all, so that every caller of bootstrap —
``ctx bootstrap``, and ``ctx shared create`` on a root that is not there yet — runs the same
steps.  Each step stands alone: one that fails is reported and the others still run.
"""

import cortexfs.agents.entries  # agent entries another install of ctx wrote
import cortexfs.manual  # the manual bundle (D-1)
import cortexfs.shared.home_sessions  # home sessions an older version left group-readable
import cortexfs.shared.space_modes_check  # spaces whose directories have older modes
import cortexfs.tools.core.bootstrap  # noqa: F401  (the core tools, tsh, bin/ctxterm)
