"""The `mftk` command line: one thin Typer module per subcommand."""
