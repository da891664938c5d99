"""``python -m cortexfs`` is the ``ctx`` command."""

from cortexfs.cli import main

main()
