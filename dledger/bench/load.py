"""The load generator of ``dledger bench cluster``: appends straight to the leader over one pipelined
remoting connection, closed loop (entries/s) or open loop at a fixed rate (latency).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterator
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.internet.task import LoopingCall

from dledger.bench.runner import progress
from dledger.bench.timeline import LatencySeries, RateSeries, percentile_curve
from dledger.codes import ResponseCode
from dledger.config import parse_peers
from dledger.errors import DLedgerError
from dledger.messages import AppendEntryRequest, MetadataRequest
from dledger.transport.outbox import send_written, sendable_connection, wrote
from dledger.transport.sockopts import set_no_delay


async def pause(reactor: Any, seconds: float) -> None:
    from twisted.internet.task import deferLater

    await deferLater(reactor, seconds, lambda: None)


# -- the load generator ----------------------------------------------------------------------------
class Loader:
    """Sends appends straight to the leader over one pipelined remoting connection."""

    def __init__(self, reactor: Any, peers: str, group: str, size: int, *, binary: bool = True,
                 credentials: Any = None):
        from dledger.client import RemoteTransport

        self.reactor = reactor
        self.group = group
        self.members = list(parse_peers(peers))
        self.credentials = credentials
        self.transport = RemoteTransport(reactor, {pid: p.address for pid, p in parse_peers(peers).items()},
                                         timeout=10.0, credentials=credentials)
        self.body = os.urandom(size)
        self.leader: str | None = None
        self.binary = binary
        self.raw: RawAppends | None = None

    async def find_leader(self, timeout: float = 30.0) -> str:
        deadline = self.reactor.seconds() + timeout
        while self.reactor.seconds() < deadline:
            for mid in self.members:
                try:
                    meta = await self.transport.send(mid, MetadataRequest(group=self.group, remote_id=mid,
                                                                          detail=True), timeout=1.0)
                except DLedgerError:
                    continue
                # leaderId is what every DLedger member sends (Java DLedger sends no role): trust a member
                # that names itself, and ask the one named by another before trusting it.
                if meta.leader_id == mid and meta.role in (None, "LEADER"):
                    self.leader = mid
                    return mid
            await pause(self.reactor, 0.05)
        raise DLedgerError(ResponseCode.NOT_LEADER, f"no leader within {timeout:g}s")

    async def connect_raw(self) -> None:
        """Open the load connection to the leader (pre-encoded frames, see :class:`RawAppends`)."""
        from twisted.internet.endpoints import clientFromString, connectProtocol

        from dledger.transport.client import client_endpoint_description

        address = self.transport.members[self.leader]
        self.raw = RawAppends(self.group, self.leader, self.body, binary=self.binary)
        endpoint = clientFromString(self.reactor, client_endpoint_description(address))
        if self.credentials is not None and self.credentials.tls_options is not None:
            from dledger.security.tls import wrap_client_endpoint

            endpoint = wrap_client_endpoint(self.credentials.tls_options, endpoint, clock=self.reactor)
        await connectProtocol(endpoint, self.raw)

    def send(self, count: int, on_reply: Any) -> None:
        """One APPEND of ``count`` bodies; ``on_reply(code)`` gets the reply's DLedger code, None if the link broke."""
        self.raw.send(count, on_reply)

    async def closed_loop(self, label: str, count: int, in_flight: int, duration: float, warmup: float) -> dict:
        """``in_flight`` requests of ``count`` bodies outstanding at all times; entries acknowledged per second."""
        reactor = self.reactor
        start = reactor.seconds()
        measure_from, end = start + warmup, start + warmup + duration
        st = {"acked": 0, "requests": 0, "errors": {}, "outstanding": 0}
        finished: Deferred = Deferred()
        timeline = RateSeries(start)  # warm-up included: the plot shows the ramp

        def issue() -> None:
            st["outstanding"] += 1
            self.send(count, replied)

        def replied(code: int | None) -> None:
            st["outstanding"] -= 1
            now = reactor.seconds()
            if code == ResponseCode.SUCCESS:
                if now <= end:
                    timeline.add(now, count)
                if measure_from <= now <= end:
                    st["acked"] += count
                    st["requests"] += 1
                again()
            else:
                error("NETWORK_ERROR" if code is None else ResponseCode.of(code).name)

        def error(name: str) -> None:
            st["errors"][name] = st["errors"].get(name, 0) + 1
            reactor.callLater(0.01, again)

        def again() -> None:
            if reactor.seconds() < end:
                issue()
            elif st["outstanding"] == 0 and not finished.called:
                finished.callback(None)

        ticker = LoopingCall(lambda: progress(f"{label}: {max(0.0, reactor.seconds() - measure_from):.1f}/"
                                              f"{duration:g} s, {st['acked']:,} entries acknowledged"))
        ticker.clock = reactor
        ticker.start(1.0, now=False)
        for _ in range(in_flight):
            issue()
        try:
            await finished
        finally:
            ticker.stop()
        return {"entries_per_s": st["acked"] / duration, "requests_per_s": st["requests"] / duration,
                "bodies_per_request": count, "in_flight": in_flight, "errors": st["errors"],
                "timeline": {**timeline.to_dict(), "warmup_s": warmup}}

    async def open_loop(self, rate: int, duration: float, warmup: float) -> dict:
        """Offer ``rate`` one-entry appends per second; latency from each request's scheduled time."""
        reactor = self.reactor
        start = reactor.seconds()
        measure_from, end = start + warmup, start + warmup + duration
        latencies: list[float] = []
        timeline = LatencySeries(start)
        st = {"sent": 0, "outstanding": 0, "errors": 0, "acked": 0}
        finished: Deferred = Deferred()

        def send_due() -> None:
            now = reactor.seconds()
            due = int((min(now, end) - start) * rate)
            while st["sent"] < due:
                scheduled = start + st["sent"] / rate
                st["sent"] += 1
                st["outstanding"] += 1
                self.send(1, lambda code, scheduled=scheduled: replied(code, scheduled))
            send_written()  # this tick's requests leave now, not after the next poll (as the members' writes)
            if now >= end:
                sender.stop()
                maybe_done()

        def replied(code: int | None, scheduled: float) -> None:
            st["outstanding"] -= 1
            if code == ResponseCode.SUCCESS:
                latency = reactor.seconds() - scheduled
                timeline.add(scheduled, latency)
                if scheduled >= measure_from:
                    latencies.append(latency)
                    st["acked"] += 1
            else:
                st["errors"] += 1
            maybe_done()

        def maybe_done() -> None:
            if not sender.running and st["outstanding"] == 0 and not finished.called:
                finished.callback(None)

        sender = LoopingCall(send_due)
        sender.clock = reactor
        ticker = LoopingCall(lambda: progress(f"latency: {max(0.0, reactor.seconds() - measure_from):.1f}/"
                                              f"{duration:g} s at {rate:,}/s offered, {st['outstanding']} waiting"))
        ticker.clock = reactor
        ticker.start(1.0, now=False)
        sender.start(0.001)
        try:
            await finished
        finally:
            ticker.stop()
        latencies.sort()
        return {"offered_per_s": rate, "achieved_per_s": st["acked"] / duration, "errors": st["errors"],
                "p50_ms": _pct(latencies, 0.50), "p99_ms": _pct(latencies, 0.99), "p999_ms": _pct(latencies, 0.999),
                "max_ms": latencies[-1] * 1e3 if latencies else None, "samples": len(latencies),
                "timeline": {**timeline.to_dict(), "warmup_s": warmup}, "percentiles": percentile_curve(latencies)}

    async def close(self) -> None:
        if self.raw is not None:
            self.raw.transport.loseConnection()
        await self.transport.close()


class RawAppends(Protocol):
    """The benchmark's load connection: APPEND frames encoded once, only the opaque changes per request.

    The load generator shares the machine with the members, so it should spend as little CPU as
    possible: a request costs a header format and a write, a reply two regex matches on the read
    buffer and a plain callback (no Deferred, no frame objects).  The frames are the ones
    :mod:`dledger.transport.remoting` writes: dledger's binary APPEND body, or Java's JSON form with
    ``binary=False`` (``--java-frames``).
    """

    def __init__(self, group: str, leader: str, body: bytes, *, binary: bool = True):
        from dledger.transport import remoting

        self.remoting = remoting
        self.binary = binary
        self.frames: dict[int, tuple[bytes, bytes, bytes]] = {}  # count -> (header before opaque, after, body)
        self.make = lambda n: AppendEntryRequest(group=group, remote_id=leader, body=body) if n == 1 \
            else AppendEntryRequest(group=group, remote_id=leader, batch_msgs=[body] * n)
        self.buffer = bytearray()
        self.waiting: dict[int, Any] = {}
        self.opaque = 0
        #: Set when the connection is gone: later sends are answered None at once instead of waiting forever.
        self.lost = False
        #: The plain TCP connection whose writes the open loop's tick sends at its end (None under TLS); the
        #: closed loop leaves its requests to Twisted's next poll, which groups them (sending each read's
        #: requests at once cost the generator ~4 % more CPU per entry and bought no measured figure).
        self._sendable = None

    def connectionMade(self) -> None:
        set_no_delay(self.transport)
        self._sendable = sendable_connection(self.transport)

    def _template(self, count: int) -> tuple[bytes, bytes, bytes]:
        """The frame of a ``count``-body APPEND cut around its opaque (a sentinel no real opaque reaches)."""
        frame = self.remoting.encode_request(self.make(count), _SENTINEL_OPAQUE, binary=self.binary)
        head_len = int.from_bytes(frame[4:8], "big")
        head, body = frame[8:8 + head_len], frame[8 + head_len:]
        before, after = head.split(b"%d" % _SENTINEL_OPAQUE)
        return before, after, body

    def send(self, count: int, on_reply: Any) -> None:
        """One APPEND of ``count`` bodies; ``on_reply(code)`` once answered (None if the connection is lost)."""
        if self.lost:
            on_reply(None)
            return
        parts = self.frames.get(count)
        if parts is None:
            parts = self.frames[count] = self._template(count)
        before, after, body = parts
        self.opaque += 1
        self.waiting[self.opaque] = on_reply
        head = b"%s%d%s" % (before, self.opaque, after)
        self.transport.write(b"".join((_LENGTHS.pack(4 + len(head) + len(body), len(head)), head, body)))
        wrote(self._sendable)

    def dataReceived(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        try:
            for head, head_end, end in reply_frames(buf):
                opaque = _OPAQUE.search(buf, head, head_end)
                code = _CODE.match(buf, head_end, end)
                on_reply = self.waiting.pop(int(opaque.group(1)), None) if opaque else None
                if on_reply is not None:
                    on_reply(int(code.group(1)) if code else json.loads(bytes(buf[head_end:end]))["code"])
        except ValueError:
            self.transport.loseConnection()

    def connectionLost(self, reason: Any = None) -> None:
        self.lost = True
        waiting, self.waiting = self.waiting, {}
        for on_reply in waiting.values():
            on_reply(None)


def reply_frames(buf: bytearray) -> Iterator[tuple[int, int, int]]:
    """``(header start, header end, frame end)`` of each whole frame at the start of ``buf``, read by the
    load generators that pick a reply's fields by pattern instead of decoding it (``RawAppends``, the
    broker bench's ``RawSends``).  Once iterated to the end, the frames are removed from ``buf``; a frame
    whose lengths do not fit (a header past its frame) raises ValueError.
    """
    pos, size = 0, len(buf)
    while size - pos >= 8:
        total, word = _LENGTHS.unpack_from(buf, pos)
        end = pos + 4 + total
        head_end = pos + 8 + (word & 0xFFFFFF)
        if total < 4 or head_end > end:
            raise ValueError(f"a reply frame of {total} bytes announces a {word & 0xFFFFFF}-byte header")
        if end > size:
            break
        yield pos + 8, head_end, end
        pos = end
    del buf[:pos]


_SENTINEL_OPAQUE = 2_000_000_123
_LENGTHS = struct.Struct(">iI")
#: The reply's DLedger code: the first key of a compact, sorted JSON body (``{"code":0,...``).
_CODE = re.compile(rb'\{"code":(-?\d+)[,}]')
_OPAQUE = re.compile(rb'"opaque":(\d+)')


def _pct(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] * 1e3
