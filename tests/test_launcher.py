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
