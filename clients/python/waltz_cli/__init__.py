"""The `waltz` admin command-line tool."""
