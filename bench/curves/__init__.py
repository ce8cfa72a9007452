"""How cost grows with the work: one module per curve, each `python -m bench.curves.<name> [--quick]`."""
