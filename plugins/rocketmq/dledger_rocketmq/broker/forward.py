"""Sends that reach a slave are forwarded to the master instead of refused (beyond RocketMQ).

A client whose route is stale (the master just changed, its next route
refresh is up to ``pollNameServerInterval`` away) sends to a member that is
now a slave.  RocketMQ answers SERVICE_NOT_AVAILABLE and the send fails
(apache/rocketmq#3858 asks for forwarding).  Here a slave that knows the
current master's broker address -- from its latest registration answer
(:class:`~dledger_rocketmq.namesrv.registration.MasterFetcher`, valid only for the
dledger term and leader it was learned under) -- relays the request to the
master's broker port and relays the answer back, so a live slave address keeps
accepting sends during and after a switch.

The relayed request carries ``dledgerForwardedBy = <member id>`` in its
extFields: a member never forwards a request that was forwarded already (no
loops while two members disagree on who is master), and the master stores it
as any send.  What a forwarded message loses: its BORNHOST is the slave's
connection, not the client's (BORNHOST is informational; RocketMQ's proxy
does the same).  Without a known master, or when the master cannot be reached,
the slave answers as before (SERVICE_NOT_AVAILABLE), so the client retries.

Installed on every broker port (``port.EXTENSIONS``), active when the port has
a ``master_fetcher`` (the plugin sets it when ``rocketmq.namesrvAddr`` is set)
and ``rocketmq.forwardSendsToMaster`` is on.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger

from dledger.ratelog import RateLimitedLog
from dledger_rocketmq.broker.port import SEND_BATCH_MESSAGE, SEND_MESSAGE, SEND_MESSAGE_V2, Reply, Request

log = Logger()

#: The extFields key a forwarded request carries (its value: the forwarding member's id).
FORWARDED = "dledgerForwardedBy"
SEND_CODES = (SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE)


def should_forward(*, enabled: bool, is_master: bool, forwarded: bool, master_known: bool) -> bool:
    """Forward a send: on, this member is not master, it was not forwarded already, and the master is known."""
    return enabled and not is_master and not forwarded and master_known


def install(port) -> None:
    """Wrap the port's send handlers (after the other extensions, so it sees their checks first)."""
    port._forward_log = RateLimitedLog(log, port.broker.server.clock)
    for code in SEND_CODES:
        inner = port.handlers.get(code)
        if inner is not None:
            port.handlers[code] = _forwarding(port, inner)


def _forwarding(port, inner):
    def handler(req: Request) -> Reply | Deferred:
        broker = port.broker
        if broker.role == "MASTER":  # the hot path: nothing to decide
            return inner(req)
        fetcher = port.master_fetcher
        enabled = bool(getattr(broker.options, "forward_sends", True))
        if not should_forward(enabled=enabled, is_master=broker.role == "MASTER",
                              forwarded=bool(req.ext.get(FORWARDED)),
                              master_known=fetcher is not None and fetcher.known()):
            return inner(req)
        return relay(port, fetcher, req).addErrback(lambda f: _fallback(port, fetcher, req, inner, f))
    return handler


def relay(port, fetcher: Any, req: Request) -> Deferred:
    """The request sent on to the master's broker port; fires with the master's answer as a Reply."""
    self_id = port.broker.server.self_id
    ext = {**{k: v for k, v in req.ext.items() if v is not None}, FORWARDED: self_id}
    d = fetcher.client()
    d.addCallback(lambda c: c.request(req.code, ext, req.body, signed=False))  # the master checks the client's

    def answered(reply) -> Reply:
        header, body = reply
        port.stats.forwarded += 1
        return Reply(header.code, header.remark, header.ext_fields, body)
    return d.addCallback(answered)


def _fallback(port, fetcher, req: Request, inner, f) -> Reply | Deferred:
    port._forward_log.warn("forward", "{id}: could not forward a send to the master {m}: {e}; answering it here",
                id=port.broker.server.self_id, m=fetcher.master_addr, e=f.getErrorMessage())
    return maybeDeferred(inner, req)
