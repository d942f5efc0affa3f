"""The status page in a real headless browser (Debian's chromium over the DevTools pipe).

* a page of 7 members and 1,000 queues stays readable: 25 rows a page, a pager, a filter, sections that
  collapse -- served by the real endpoint resources from an in-process document;
* against a real 3-member ``twistd dledger`` group with the broker plugin (process test): the page
  loads, goes live, and shows the new leader within 2 s of the leader being killed (``kill -9``).

Screenshots go to the test's directory; with ``DLEDGER_DOCS_SCREENSHOTS=1`` also to ``docs/images/``
(what docs/operations.md shows).  Skipped, with the reason, where chromium is not installed
(``make test`` installs it: the Makefile's ``systools``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import pytest_twisted

from dledger.testing.browser import BrowserError, HeadlessBrowser, find_chromium

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = find_chromium()
pytestmark = [pytest.mark.network,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make systools installs "
                                 "Debian's chromium; DLEDGER_CHROMIUM names another)")]
PNG = b"\x89PNG\r\n\x1a\n"


def keep_screenshot(png_path: Path, name: str) -> None:
    """Copy a screenshot to docs/images/ when asked to (DLEDGER_DOCS_SCREENSHOTS=1)."""
    if os.environ.get("DLEDGER_DOCS_SCREENSHOTS") == "1":
        (ROOT / "docs" / "images" / name).write_bytes(png_path.read_bytes())


def big_document(now: float = 1000.0) -> dict:
    """A leader's document of a 7-member group whose broker has 1,000 queues."""
    from dledger.status.model import section, table

    ids = [f"n{i}" for i in range(7)]
    members = [{"id": m, "address": f"10.0.0.{i + 1}:20911", "self": m == "n0", "role": "LEADER" if m == "n0" else
                "FOLLOWER", "lag": 0 if m == "n0" else i * 3, "last_contact_s": None if m == "n0" else 0.05 * i,
                "in_contact": m != "n0" or None, "disk_problem": None} for i, m in enumerate(ids)]
    queues = [[f"Topic{q // 100}", q % 100, 0, 1000 + q] for q in range(1000)]
    broker = section("rocketmq-topics", "RocketMQ broker broker-a (MASTER): topics and queues",
                     summary=[("dispatch lag (bytes)", 0), ("queues", 1000)],
                     tables=[table("rocketmq-queues", "queues", ["topic", "queue", "min offset", "max offset"],
                                   queues)])
    n = 60
    return {"group": "g0", "self_id": "n0", "now": now, "running": True,
            "member": {"role": "LEADER", "term": 7, "leader": "n0", "begin": 0, "end": 123456, "end_term": 7,
                       "committed": 123456, "applied": 123456, "pending": 2, "store_type": "mmap",
                       "store_bytes": 987654321, "disk_used_ratio": 0.42, "disk_problem": None,
                       "store_damaged": None, "scrub": None},
            "members": members,
            "events": [{"at": now - 30 * k, "term": 7 - k, "role": "LEADER", "leader": "n0",
                        "reason": f"won the vote in term {7 - k}"} for k in range(3)],
            "series": {"t": list(range(n)), "commits_per_s": [1000 + 50 * (i % 7) for i in range(n)],
                       "appends_per_s": [990 + 40 * (i % 5) for i in range(n)],
                       "latency_mean_ms": [1.5 + (i % 4) * 0.2 for i in range(n)],
                       "latency_p50_ms": [1.2] * n, "latency_p99_ms": [4.0 + (i % 9) for i in range(n)]},
            "sections": [broker]}


class FixedBoard:
    """A StatusBoard stand-in serving one document."""

    def __init__(self, doc):
        self.doc = doc

    def document(self):
        return self.doc


@pytest_twisted.ensureDeferred
async def test_seven_members_and_a_thousand_queues_stay_readable(tmp_path, reactor):
    """25 queue rows a page with a pager and a filter; every member on one screen; sections collapse."""
    from twisted.web.resource import Resource
    from twisted.web.server import Site

    from dledger.status.resource import StatusRoot

    site = Site(StatusRoot(Resource(), FixedBoard(big_document())))
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    browser = HeadlessBrowser(reactor, CHROMIUM, tmp_path / "profile", height=1400)
    try:
        await browser.start()
        await browser.navigate(f"http://127.0.0.1:{port.getHost().port}/status")

        async def live():
            return await browser.evaluate("document.getElementById('banner').textContent.startsWith('live')")
        await wait(reactor, live, "the page going live")
        rows = "document.querySelectorAll('#table-rocketmq-queues tbody tr').length"
        assert await browser.evaluate(rows) == 25
        assert await browser.evaluate("document.querySelectorAll('#members tbody tr').length") == 7
        pager = "document.querySelector('#table-rocketmq-queues').previousElementSibling.textContent"
        assert "rows 1\u201325 of 1000" in await browser.evaluate(pager)
        await browser.evaluate("document.querySelector('button[data-table=\"rocketmq-queues\"][data-step=\"1\"]')"
                               ".click()")
        assert "rows 26\u201350 of 1000" in await browser.evaluate(pager)
        await browser.evaluate("(function(){var i=document.getElementById('filter-rocketmq-queues');"
                               "i.value='Topic9';i.dispatchEvent(new Event('input',{bubbles:true}));})()")
        assert "of 100" in await browser.evaluate(pager)
        height = await browser.evaluate("document.documentElement.scrollHeight")
        assert height < 4000, height  # a screenful or two, not 1,000 rows
        shot = tmp_path / "status-page-1000-queues.png"
        assert (await browser.screenshot(shot)).startswith(PNG)
        keep_screenshot(shot, "status-page-1000-queues.png")
        await browser.evaluate("document.querySelector('details[data-section=\"rocketmq-topics\"] > summary')"
                               ".click()")
        await wait(reactor, lambda: browser.evaluate(
            "!document.querySelector('details[data-section=\"rocketmq-topics\"]').open"), "the section to collapse")
        await deferLater(reactor, 1.5)  # a poll re-renders: the section must stay collapsed
        assert await browser.evaluate("document.querySelector('details[data-section=\"rocketmq-topics\"]').open") \
            is False
        assert await browser.evaluate("!document.getElementById('filter-rocketmq-queues').checkVisibility()")
    finally:
        await browser.stop()
        await port.stopListening()


async def deferLater(reactor, seconds: float):
    from twisted.internet.task import deferLater as later

    await later(reactor, seconds, lambda: None)


async def wait(reactor, condition, what: str, timeout: float = 20.0, interval: float = 0.05):
    """Poll an async condition until truthy (bounded); its value.  A script error (the page still loading)
    counts as not yet."""
    deadline = reactor.seconds() + timeout
    while True:
        try:
            value = await condition()
        except BrowserError:
            value = None
        if value:
            return value
        if reactor.seconds() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await deferLater(reactor, interval)


async def fill_broker(reactor, port: int, rounds: int = 3) -> None:
    """Messages on 8 queues (a round a second: the sparklines have a shape), a consumer group's offsets and one
    delayed message, through the broker port."""
    from dledger_rocketmq.client.client import connect

    c = await connect(reactor, "127.0.0.1", port, timeout=5.0, default_topic_queue_nums=8)
    try:
        for r in range(rounds):
            for i in range(16 * (r + 1)):
                await c.send("Orders", b"order %d" % i, queue_id=i % 8)
            await deferLater(reactor, 1.0)
        await c.send("Orders", b"in ten seconds", queue_id=0, properties={"DELAY": "3"})
        for q in range(8):
            await c.commit_offset("billing", "Orders", q, q)
    finally:
        c.close()


@pytest.mark.process
@pytest_twisted.ensureDeferred
async def test_page_shows_a_leader_change_within_two_seconds_of_a_kill(tmp_path, reactor):
    """A follower's page, live in the browser, names the new leader within 2 s of kill -9 of the old one."""
    pytest.importorskip("dledger_rocketmq")
    from dledger_rocketmq.tools.localgroup import broker_port_args, wait_for_master

    from dledger.launcher import LocalGroup, durable_store, free_ports

    store = durable_store()
    if store is None:
        pytest.skip("no durable store (mmap or lmdb) is installed")
    ids = ["n0", "n1", "n2"]
    ports = dict(zip(ids, free_ports(3), strict=True))
    group = LocalGroup(tmp_path / "group", n=3, store=store, preset="fast", metrics=True,
                       member_args=broker_port_args(ports), options={"plugins.rocketmq.enabled": True,
                                                                     "plugins.rocketmq.masterWaitTimeout": 10.0})
    admin = group.client(request_timeout=0.5)
    browser = HeadlessBrowser(reactor, CHROMIUM, tmp_path / "profile")
    try:
        await group.start_and_wait(30)
        leader = await wait_for_master(group, admin, ports, topic="Orders", queues=8)
        await browser.start()

        async def showing():
            banner, shown = await browser.texts(["#banner", "#leader"])
            return shown if banner and banner.startswith("live") else None

        # The leader's page (every follower's lag and last contact, the broker's master view): the screenshot.
        await browser.navigate(f"http://127.0.0.1:{group.members[leader].metrics_port}/status")
        assert await wait(reactor, showing, "the leader's page to go live") == leader
        await fill_broker(reactor, ports[leader])
        await wait(reactor, lambda: browser.evaluate("document.body.textContent.includes('billing')"),
                   "the broker's consumer group on the page")
        followers = await browser.evaluate("Array.from(document.querySelectorAll('#members td:nth-child(3)'))"
                                           ".map(function (e) { return e.textContent; })")
        assert sorted(followers) == ["FOLLOWER", "FOLLOWER", "LEADER"], followers
        shot = tmp_path / "status-page.png"
        assert (await browser.screenshot(shot)).startswith(PNG)
        keep_screenshot(shot, "status-page.png")

        watcher = next(m for m in ids if m != leader)
        await browser.navigate(f"http://127.0.0.1:{group.members[watcher].metrics_port}/status")
        await wait(reactor, lambda: browser.evaluate(f"document.title.includes('/{watcher} ')"), "the page to load")
        assert await wait(reactor, showing, "the follower's page to go live") == leader

        killed_at = reactor.seconds()
        group.kill(leader)

        async def new_leader():
            shown = (await browser.texts(["#leader"]))[0]
            return shown if shown in ids and shown != leader else None
        new = await wait(reactor, new_leader, "the page to show a new leader", timeout=10.0, interval=0.02)
        shown_after = reactor.seconds() - killed_at
        assert shown_after <= 2.0, f"the page showed leader {new} {shown_after:.2f}s after the kill"
        events = await browser.evaluate("document.getElementById('table-events').textContent")
        assert new in events and "heartbeat" in events, events
    finally:
        await browser.stop()
        await admin.close()
        await group.stop_all()
        group.close()
