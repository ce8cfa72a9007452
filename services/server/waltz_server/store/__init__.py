"""The store layer: a partition replicated over storage nodes through store and replica sessions."""
