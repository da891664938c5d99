"""Agents on the host side (SPEC §8): identities, controls and what the runtime derives from them.

* :mod:`~cortexfs.agents.request` — the A-3 request and the controls it becomes.
* :mod:`~cortexfs.agents.create` — ``ctx agent create``: the ``agent/<name>`` entry and its
  ``agent/<name>.d/`` controls, installed atomically by the host administrator.
* :mod:`~cortexfs.agents.view` — an agent as the tool runtime sees it: identity, mounts,
  ``CTX_PATH`` and the environment of its tool processes.
"""
