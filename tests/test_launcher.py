"""dledger.launcher's pure helpers (the process tests use them on real groups)."""

from __future__ import annotations

from dledger.entry import Entry
from dledger.launcher import StoredLog, differing_logs


def _log(member, *bodies, term=1):
    entries = [Entry(body=b, index=i, term=term, pos=100 * i).sealed() for i, b in enumerate(bodies)]
    return StoredLog(member, 0, len(entries) - 1, len(entries) - 1, entries)


def test_differing_logs_names_every_member_whose_log_is_not_the_reference():
    """Same entries: no one; a different body, a shorter log or another term: that member."""
    logs = {"n0": _log("n0", b"a", b"b"), "n1": _log("n1", b"a", b"b"), "n2": _log("n2", b"a", b"x"),
            "n3": _log("n3", b"a"), "n4": _log("n4", b"a", b"b", term=2)}
    assert differing_logs(logs, "n0") == ["n2", "n3", "n4"]
    assert differing_logs({"n0": logs["n0"], "n1": logs["n1"]}, "n1") == []


def test_a_new_member_joins_with_its_own_port_and_a_retired_one_leaves_the_peers(tmp_path):
    """new_member: the next free id, a free port, ``--peers`` of the group and itself, ``--join``; retire: gone."""
    from dledger.launcher import LocalGroup

    group = LocalGroup(tmp_path, n=3, metrics=True)
    try:
        new = group.new_member()
        assert new.id == "n3" and new.metrics_port is not None and group.ids == ["n0", "n1", "n2", "n3"]
        argv = group.argv("n3")
        assert argv[argv.index("--peers") + 1] == group.peers and "--join" in argv and "n3-127.0.0.1:" in group.peers
        assert group.configs["n3"].join_existing and group.address("n3") == f"127.0.0.1:{new.port}"
        group.retire("n0")
        assert group.ids == ["n1", "n2", "n3"] and "n0-" not in group.peers and "n0" in group.retired
        assert group.new_member().id == "n4", "a retired id is not given again"
    finally:
        group.close()
