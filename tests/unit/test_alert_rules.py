"""The alerts as code (helm/waltz/files/rules/*.yaml): every rule file passes `promtool check rules`, every alert
is exercised by a promtool unit test in files/rules/tests/*.test.yaml (all of which pass), a broken rule fails
them, and docs/operations.md names every alert. A real Prometheus evaluates them in
tests/integration/test_alerts_prometheus.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "helm/waltz/files/rules"
RULE_FILES = sorted(RULES.glob("*.yaml"))
TEST_FILES = sorted((RULES / "tests").glob("*.test.yaml"))


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: scripts/bootstrap installs it (Debian package prometheus)"
    return found


def alerts(path: Path) -> list[str]:
    return [rule["alert"] for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]
            if "alert" in rule]


def promtool_test(*files: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), "test", "rules", *map(str, files)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, check=False)


def test_every_rule_file_passes_promtool_check():
    assert RULE_FILES
    done = subprocess.run([promtool(), "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_promtool_unit_tests_pass():
    assert TEST_FILES
    done = promtool_test(*TEST_FILES, cwd=RULES / "tests")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test_and_a_line_in_the_operations_guide():
    tested: set[str] = set()
    covered_files: set[str] = set()
    for test_file in TEST_FILES:
        document = yaml.safe_load(test_file.read_text())
        covered_files |= {(test_file.parent / f).resolve().name for f in document["rule_files"]}
        tested |= {t["alertname"] for case in document["tests"] for t in case.get("alert_rule_test", [])}
    guide = (ROOT / "docs/operations.md").read_text()
    for path in RULE_FILES:
        assert path.name in covered_files, f"no tests/*.test.yaml loads {path.name}"
        for name in alerts(path):
            assert name in tested, f"{path.name}: {name} has no alert_rule_test"
            assert f"`{name}`" in guide, f"docs/operations.md does not name {name}"


BROKEN = [
    # under-replication counted with <= fires on a healthy partition
    ("replication.yaml", "< ignoring(state)", "<= ignoring(state)", "WaltzPartitionUnderReplicated"),
    # against the assignment, unassigning a dead replica would clear it
    ("replication.yaml", "< on () group_left waltz_expected_replication_factor",
     '< ignoring(state) waltz_server_partition_replicas{state="assigned"}', "WaltzPartitionBelowReplicationFactor"),
    # the write set as scraped goes pending at the one scrape of 0 while a graceful restart reopens the session
    ("replication.yaml", 'max_over_time(waltz_server_partition_replicas{state="write_set"}[1m])',
     'waltz_server_partition_replicas{state="write_set"}', "WaltzPartitionWithoutQuorum"),
    # without the data's age, a node that received its data after it started fires
    ("storage-damage.yaml",
     "          and on (instance) (max by (instance) (waltz_storage_partition_max_transaction_id offset 6h) >= 0)\n",
     "", "WaltzStorageScrubbingStalled"),
    # without the zero, a component with no process up at all would count nothing, and fire nothing
    ("targets.yaml", " or on (component) (waltz_expected_processes * 0)", "", "WaltzFewerProcessesThanExpected"),
]


@pytest.mark.parametrize(("rule_file", "original", "changed", "alert"), BROKEN)
def test_a_broken_rule_fails_its_unit_tests(tmp_path: Path, rule_file: str, original: str, changed: str,
                                            alert: str):
    """The unit tests can fail: each of these changes of a rule makes its alert's test fail."""
    (tmp_path / "tests").mkdir()
    text = (RULES / rule_file).read_text()
    assert original in text
    (tmp_path / rule_file).write_text(text.replace(original, changed, 1))
    test_file = rule_file.replace(".yaml", ".test.yaml")
    shutil.copy(RULES / "tests" / test_file, tmp_path / "tests")
    done = promtool_test(tmp_path / "tests" / test_file, cwd=tmp_path / "tests")
    assert done.returncode != 0 and alert in done.stdout + done.stderr
