"""``python -m kdtr.cli``: the ``kdtr`` command without the console script."""

from kdtr.cli.main import entry

entry()
