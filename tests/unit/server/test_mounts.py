"""MountRegistry: the newest mount of a client wins; older network clients become stale."""

from __future__ import annotations

from waltz_server.mounts import MountRegistry


def test_newer_mount_replaces_and_older_is_refused():
    mounts = MountRegistry()
    assert mounts.register(1, stream_id=10, generation=1, seq_num=1) == (True, None)
    assert mounts.is_current(1, 10)
    assert mounts.register(1, stream_id=11, generation=1, seq_num=2) == (True, 10)
    assert not mounts.is_current(1, 10) and mounts.is_current(1, 11) and mounts.is_known(1)
    assert mounts.register(1, stream_id=10, generation=1, seq_num=1) == (False, None)
    assert mounts.register(1, stream_id=12, generation=2, seq_num=0) == (True, 11)  # newer generation
    assert mounts.register(1, stream_id=12, generation=2, seq_num=0) == (True, None)  # remount, same stream


def test_removing_a_stream_forgets_its_clients_only():
    mounts = MountRegistry()
    mounts.register(1, 10, 1, 1)
    mounts.register(2, 10, 1, 1)
    mounts.register(3, 11, 1, 1)
    assert sorted(mounts.remove_stream(10)) == [1, 2]
    assert len(mounts) == 1 and not mounts.is_known(1) and mounts.is_current(3, 11)
