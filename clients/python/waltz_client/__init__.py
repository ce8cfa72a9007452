"""Waltz Python client: WaltzClient, transaction contexts and callbacks."""
