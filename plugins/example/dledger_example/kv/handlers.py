"""The kv map's request codes on a member: a linearizable get, and writes that answer with their outcome.

* ``kv.get`` (:data:`GET_CODE`, role ``read``): the leader confirms it still leads (Raft's ReadIndex:
  :meth:`dledger.server.DLedgerServer.read_index`), waits until the machines applied that index
  (``server.snapshots.wait_applied``) and answers from its map -- so a get sees every write acknowledged
  before it started, and a deposed leader never answers.  Any other member answers NOT_LEADER, naming
  the leader, and the client asks it.
* ``kv.write`` (:data:`WRITE_CODE`, role ``write``): the body is the entry (put, delete or cas,
  :mod:`.codec`); the leader checks it, appends it and answers once its own machine applied it, with
  the outcome (for a cas: whether it matched).  A retry with the same operation id gets the first
  outcome (:class:`.machine.KVMachine` applies an operation once).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.plugin_types import RequestHandler
from dledger_example.kv.codec import Op, decode_get, decode_op, encode_reply

GET_CODE = 55100
WRITE_CODE = 55101
#: Seconds a write waits for its entry to be applied here after it committed (then TIMEOUT: ambiguous).
APPLY_WAIT = 30.0


def check_write(body: bytes, max_value: int) -> Op:
    """The write a request body holds, as the leader accepts it; ValueError saying why not."""
    op = decode_op(body)  # NotKV is a ValueError too
    for what, value in (("value", op.value), ("expected value", op.expected)):
        if value is not None and len(value) > max_value:
            raise ValueError(f"the {what} is {len(value)} bytes, more than kv.max_value ({max_value})")
    return op


class KVHandlers:
    """The two request codes of one member's kv map."""

    def __init__(self, server, machine, max_value: int):
        self.server = server
        self.machine = machine
        self.max_value = max_value

    def request_handlers(self) -> list[RequestHandler]:
        return [RequestHandler(GET_CODE, "kv.get", "read", self.get, "linearizable read of one key"),
                RequestHandler(WRITE_CODE, "kv.write", "write", self.write, "put, delete or compare-and-set")]

    def get(self, body: bytes) -> Deferred:
        try:
            key = decode_get(body)
        except ValueError as exc:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"kv.get: {exc}") from None
        server = self.server
        d = server.read_index()
        d.addCallback(server.snapshots.wait_applied)
        d.addCallback(lambda _: encode_reply(self.machine.get(key)))
        return d

    def write(self, body: bytes) -> Deferred:
        try:
            op = check_write(body, self.max_value)
        except ValueError as exc:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"kv.write: {exc}") from None
        server = self.server
        if not server.leads():
            raise server.not_leader()
        done = self.machine.outcome(op.op_id)
        if done.called:  # a retry of an operation already applied: its first outcome, nothing appended
            return done.addCallback(encode_reply)

        def not_appended(failure):
            self.machine.forget(op.op_id, done)
            return failure

        def appended(_response):
            return done.addTimeout(APPLY_WAIT, server.clock, onTimeoutCancel=self._timed_out(op, done))

        d = server.append(bytes(body))
        d.addCallbacks(appended, not_appended)
        return d.addCallback(encode_reply)

    def _timed_out(self, op: Op, done: Deferred):
        def cancelled(result, timeout):
            self.machine.forget(op.op_id, done)
            raise DLedgerError(ResponseCode.TIMEOUT, f"kv.write: entry committed but not applied within {timeout:g}s")
        return cancelled
