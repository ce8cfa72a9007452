"""The store layer: a partition replicated over storage nodes through store and replica sessions.

Wiring (the server's main): one ``StorageConnections`` pool for the process, made from ZooKeeper's store
parameters (``await StorageConnections.from_zookeeper(zk, paths, settings)``), and one
``ReplicatedStorePartition(pid, zk=zk, paths=paths, connections=pool, settings=settings)`` per partition
this server owns, started with ``await store.start(generation)`` and closed with ``await store.close()``;
close the pool last (``await pool.close()``). ``STORE_KEYS`` are the configuration keys it reads
(``StoreSettings.from_config(config)``).
"""

from waltz_server.store.settings import STORE_KEYS, StoreSettings

__all__ = ["STORE_KEYS", "StoreSettings"]
