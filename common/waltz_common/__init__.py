"""Code shared by the Waltz storage node, server and clients (stubs, metadata, config, metrics)."""
