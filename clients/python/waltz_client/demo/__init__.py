"""Demo applications built on the Waltz client."""
