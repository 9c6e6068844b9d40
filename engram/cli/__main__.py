"""`python -m engram.cli ...`: the same as the `engram` command."""

from engram.cli.commands import main

main()
