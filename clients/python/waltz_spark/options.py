"""The `waltz` data source options, parsed and checked into one typed value."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from waltz_common.config import ConfigError, address_list
from waltz_common.tls import TlsFiles
from waltz_common.zk_security import ZkSecurity

DEFAULT_RECORDS_PER_TASK = 250_000
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_READ_STREAMS = 1

Position = Literal["earliest", "latest"]


class OptionError(ValueError):
    """An option of the `waltz` data source is missing or malformed."""


@dataclass(frozen=True)
class SourceOptions:
    """What to read: the cluster, the partitions, the id range and how much per task and batch."""

    zookeeper: str
    root: str
    partitions: str | None = None
    starting: Position | dict[int, int] = "earliest"
    ending: Position | dict[int, int] = "latest"
    max_records_per_partition: int | None = None
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    batch_size: int = 0
    records_per_task: int = DEFAULT_RECORDS_PER_TASK
    read_streams: int = DEFAULT_READ_STREAMS
    timeout_s: float = DEFAULT_TIMEOUT_S
    tls: TlsFiles | None = None
    zookeeper_security: ZkSecurity | None = None
    servers: tuple[str, ...] = ()


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """The data source options (keys case-insensitive, as Spark passes them) as SourceOptions."""
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    zookeeper = lowered.get("zookeeper", "").strip()
    root = lowered.get("root", "").strip()
    try:
        servers = address_list(lowered.get("servers", ""))
    except ValueError as exc:
        raise OptionError(f"option 'servers': {exc}") from None
    if not servers and not zookeeper:
        raise OptionError(
            "option 'servers' (Waltz servers, host:port,host:port) or 'zookeeper' (the ZooKeeper connect string, "
            "e.g. 127.0.0.1:2181, with 'root') is required"
        )
    if not servers and not root.startswith("/"):
        raise OptionError("option 'root' is required: the cluster root znode, e.g. /waltz/my_cluster")
    caps = {
        name: None if lowered.get(name.lower()) is None else _positive(name, lowered[name.lower()])
        for name in ("maxRecordsPerPartition", "maxRecordsPerTrigger", "maxBytesPerTrigger")
    }
    try:  # the files must be readable at these paths on the driver and on every executor
        tls = TlsFiles.of(lowered.get("tls.certfile"), lowered.get("tls.keyfile"), lowered.get("tls.cafile"), "options")
        zk_security = ZkSecurity.of(
            lowered.get("zookeeper.tls.certfile"),
            lowered.get("zookeeper.tls.keyfile"),
            lowered.get("zookeeper.tls.cafile"),
            lowered.get("zookeeper.auth"),
            source="options",
        )
    except ConfigError as exc:
        raise OptionError(str(exc)) from None
    return SourceOptions(
        zookeeper=zookeeper,
        root=root,
        partitions=lowered.get("partitions") or None,
        starting=_parse_offsets("startingOffsets", lowered.get("startingoffsets", "earliest")),
        ending=_parse_offsets("endingOffsets", lowered.get("endingoffsets", "latest")),
        max_records_per_partition=caps["maxRecordsPerPartition"],
        max_records_per_trigger=caps["maxRecordsPerTrigger"],
        max_bytes_per_trigger=caps["maxBytesPerTrigger"],
        batch_size=_positive("batchSize", lowered["batchsize"]) if "batchsize" in lowered else 0,
        records_per_task=_positive("recordsPerTask", lowered.get("recordspertask", str(DEFAULT_RECORDS_PER_TASK))),
        read_streams=_positive("readStreams", lowered.get("readstreams", str(DEFAULT_READ_STREAMS))),
        timeout_s=float(_positive("timeoutSeconds", lowered.get("timeoutseconds", str(int(DEFAULT_TIMEOUT_S))))),
        tls=tls,
        zookeeper_security=zk_security,
        servers=servers,
    )


def _positive(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {name!r} must be a positive integer, not {text!r}") from None
    if value < 1:
        raise OptionError(f"option {name!r} must be a positive integer, not {text!r}")
    return value


def _parse_offsets(name: str, text: str) -> Position | dict[int, int]:
    """'earliest', 'latest' or a JSON object {"<pid>": <transaction id>} (ids >= 0)."""
    stripped = text.strip()
    if stripped.lower() in ("earliest", "latest"):
        return "earliest" if stripped.lower() == "earliest" else "latest"
    try:
        raw = json.loads(stripped)
    except json.JSONDecodeError:
        raise OptionError(f'option {name!r} must be earliest, latest or JSON like {{"0": 42}}, not {text!r}') from None
    if not isinstance(raw, dict):
        raise OptionError(f'option {name!r} must be a JSON object like {{"0": 42}}, not {text!r}')
    result: dict[int, int] = {}
    for key, value in raw.items():
        try:
            pid = int(key)
        except ValueError:
            raise OptionError(f"option {name!r}: {key!r} is not a partition id") from None
        if pid < 0 or isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise OptionError(f"option {name!r}: partition {key} needs a transaction id >= 0, not {value!r}")
        result[pid] = value
    return result
