"""Tools as files (SPEC §6): objects, manifests, ``CTX_PATH``, the runner, hooks, core tools.

* :mod:`~cortexfs.tools.controls` — a tool on disk: the executable and its ``.d/`` (T-1).
* :mod:`~cortexfs.tools.manifest` — v2 manifests and their validation (T-8).
* :mod:`~cortexfs.tools.pairs` / :mod:`~cortexfs.tools.install` — atomic installs into tiers.
* :mod:`~cortexfs.tools.ctxpath` — name resolution along ``CTX_PATH`` (T-4).
* :mod:`~cortexfs.tools.runner` — :func:`~cortexfs.tools.runner.run_native` and
  :func:`~cortexfs.tools.runner.run_terminal`: one call through the whole chain (T-3..T-7).
* :mod:`~cortexfs.tools.core` — the core tool programs installed by ``ctx bootstrap`` (R-5).

This package imports nothing on its own: core tool programs start with it on every call.
"""
