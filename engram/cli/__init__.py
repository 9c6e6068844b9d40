"""The `engram` command line: every subcommand and what they share."""
