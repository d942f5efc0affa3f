"""``dledger bench members --quick`` (issue #23 item 8): the benchmark runs and its figures are consistent.

About 14 s on an idle 2-core machine (20 s loaded); in ``make test``, so every item of #23 has its test there.
"""

import pytest
import pytest_twisted

from dledger.bench import members as members_bench
from dledger.launcher import durable_store

pytestmark = [pytest.mark.process, pytest.mark.network,
              pytest.mark.skipif(durable_store() is None, reason="no durable store (mmap or lmdb) is installed")]


@pytest_twisted.ensureDeferred
async def test_bench_members_quick_reports_every_change_and_the_catch_up(reactor, tmp_path):
    lines = []
    result = await members_bench.run(reactor, members_bench.Options(size_mib=2, entry_kib=16,
                                                                    directory=str(tmp_path)), lines.append)
    kinds = [c["change"].split(" n")[0] for c in result["changes"]]
    assert kinds == ["add learner", "promote", "remove follower", "remove leader", "replace follower"]
    for c in result["changes"]:
        assert 0 < c["outage_seconds"] and c["answered_seconds"] > 0 and c["acks_in_window"] > 0, c
    assert result["check_ok"], result["check"]
    assert result["catch_up"]["bytes"] == 2 << 20 and result["catch_up"]["seconds"] > 0
    text = members_bench.format_results(result)
    assert "remove leader" in text and "learner catch-up: 2 MiB" in text
