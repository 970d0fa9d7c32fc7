"""``python -m graphflow.cli``."""

from graphflow.cli import main

main()
