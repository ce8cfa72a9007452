"""What `waltz cluster create` warns about the ACL of the cluster's znodes (issue 25)."""

from __future__ import annotations

from kazoo.security import ACL, Id, Permissions

from waltz_common.cluster_admin import acl_warning
from waltz_common.zk_security import parse_acl


def test_a_cluster_without_an_acl_or_open_to_the_world_is_warned_about():
    assert "created without zookeeper.acl" in (acl_warning(None) or "")
    assert "created without zookeeper.acl" in (acl_warning([]) or "")
    open_world = [ACL(Permissions.ALL, Id("world", "anyone"))]
    assert "do more than read" in (acl_warning(open_world) or "")
    assert acl_warning(parse_acl("digest:operator:x; x509:CN=waltz server,O=waltz")) is None
