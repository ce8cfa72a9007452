"""Waltz server: partition ownership, store sessions, recovery, locks and feeds."""
