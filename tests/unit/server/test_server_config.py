"""Server configuration keys and the partition settings built from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from waltz_common.config import Config, ConfigError, load
from waltz_server.config import PartitionSettings, all_keys

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "server.example.yaml"


def test_defaults_and_required_keys():
    config = Config(all_keys(), {"zookeeper.connectString": "z:1", "cluster.root": "/w", "server.port": 5})
    assert config["server.host"] == "127.0.0.1" and config["server.metrics.port"] == 0
    assert config["server.optimisticLockTableSize"] == 30000 and config["storage.maxBatchSize"] == 500
    assert config["server.shutdownGraceSeconds"] == 10.0
    assert config["storage.checkpointInterval"] == 250000  # the store layer's keys are included
    assert PartitionSettings.from_config(config) == PartitionSettings()
    with pytest.raises(ConfigError, match=r"server\.port"):
        Config(all_keys(), {"zookeeper.connectString": "z:1", "cluster.root": "/w"})


def test_the_example_file_is_valid_and_sizes_must_be_positive():
    PartitionSettings.from_config(load(EXAMPLE, all_keys()))
    with pytest.raises(ConfigError, match=r"storage\.maxBatchSize"):
        PartitionSettings(max_batch_size=0)


def test_every_key_is_unique():
    names = [k.name for k in all_keys()]
    assert len(names) == len(set(names))
