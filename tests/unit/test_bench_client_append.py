"""bench.client_append's worker runs real appends through AsyncWaltzClient over its in-process stand-in server."""

from bench.client_append import run_writers
from waltz_common import event_loop


def test_a_fixed_count_of_appends_commits_each_once_in_batches() -> None:
    result = event_loop.run(run_writers(20, 0.0, 0.0, appends=300))
    assert result["committed"] == 300 and result["cpu"] > 0 and result["server_cpu"] > 0
    assert 1 < result["batch"] <= 20  # the writers' appends went out together (one AppendBatch per round)
