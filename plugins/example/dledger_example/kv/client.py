"""Clients of the kv map: :class:`ReplicatedDict` blocks and looks like a dict, :class:`DeferredDict` is the same
with Deferreds, :class:`KVClient` returns the raw :class:`Reply` (Deferreds).

Both send the kv request codes through dledger's client (``DLedgerClient.request``), which finds the
leader and follows redirects.  Gets are linearizable (the leader's ReadIndex).  Writes carry an
operation id chosen here, kept across the client's retries: a write whose outcome was ambiguous (a
timeout, a leader change) is retried and applied once, and the retry answers with its first outcome.

    from dledger_example.kv.client import ReplicatedDict

    with ReplicatedDict("n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913", "g0") as d:
        d["colour"] = "blue"
        assert d["colour"] == "blue" and "colour" in d
        assert d.cas("colour", "blue", "green") and not d.cas("colour", "blue", "red")
        del d["colour"]
"""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.internet.defer import Deferred

from dledger_example.kv.codec import Op, Reply, decode_reply, encode_get, encode_op
from dledger_example.kv.handlers import GET_CODE, WRITE_CODE


def new_op_id() -> bytes:
    return os.urandom(8)


class KVClient:
    """The kv map over a :class:`dledger.client.DLedgerClient`; every call returns a Deferred of a :class:`Reply`.

    ``reply.ok``: the get found the key / the write took effect (a delete: the key was there; a cas:
    it matched); ``reply.value``: the value read, or after a failed cas the value the key holds;
    ``reply.index``: the write's entry, or the applied index the get read at.
    """

    def __init__(self, client):
        self.client = client

    def read(self, key: str) -> Deferred:
        """A linearizable read of ``key``: sees every write acknowledged before it was called."""
        d = self.client.request(GET_CODE, encode_get(key), retry_ambiguous=True)
        return d.addCallback(decode_reply)

    def get(self, key: str, default: bytes | None = None) -> Deferred:
        """The value of ``key`` (``default`` if absent)."""
        return self.read(key).addCallback(lambda r: r.value if r.ok else default)

    def write(self, op: Op) -> Deferred:
        d = self.client.request(WRITE_CODE, encode_op(op), retry_ambiguous=True)
        return d.addCallback(decode_reply)

    def put(self, key: str, value: bytes) -> Deferred:
        return self.write(Op("put", new_op_id(), key, value))

    def delete(self, key: str) -> Deferred:
        return self.write(Op("delete", new_op_id(), key))

    def cas(self, key: str, expected: bytes | None, new: bytes | None) -> Deferred:
        """Set ``key`` to ``new`` if it holds ``expected`` (None: if it is absent; ``new`` None: delete it)."""
        return self.write(Op("cas", new_op_id(), key, new, expected))


#: How ReplicatedDict turns values into bytes and back: ``codec=`` one of these names or a (encode, decode) pair.
CODECS = {
    "utf-8": (lambda v: v.encode("utf-8"), lambda b: b.decode("utf-8")),
    "bytes": (bytes, bytes),
    "json": (lambda v: json.dumps(v, sort_keys=True, separators=(",", ":")).encode(), json.loads),
}


def _codec(codec: Any) -> tuple:
    return CODECS[codec] if isinstance(codec, str) else codec


class DeferredDict:
    """:class:`ReplicatedDict`'s calls for Twisted programs: each returns a Deferred (values through ``codec``).

    ``DeferredDict(dledger_client)`` over a :class:`dledger.client.DLedgerClient` (``connect(peers, group)``
    or a ``Cluster``'s client): ``get(k, default)``, ``contains(k)``, ``set(k, v)``, ``pop(k, default)``
    (KeyError if absent and no default), ``cas(k, old, new)`` (True if set) -- the methods of PySyncObj's
    ``ReplDict``, asynchronous.
    """

    _missing = object()

    def __init__(self, client, codec: Any = "utf-8"):
        self.kv = KVClient(client)
        self._encode, self._decode = _codec(codec)

    def get(self, key: str, default: Any = None) -> Deferred:
        return self.kv.read(key).addCallback(lambda r: self._decode(r.value) if r.ok else default)

    def contains(self, key: str) -> Deferred:
        return self.kv.read(key).addCallback(lambda r: r.ok)

    def set(self, key: str, value: Any) -> Deferred:
        return self.kv.put(key, self._encode(value)).addCallback(lambda r: None)

    def pop(self, key: str, default: Any = _missing) -> Deferred:
        def popped(reply):
            if reply.ok:
                return self._decode(reply.value)
            if default is DeferredDict._missing:
                raise KeyError(key)
            return default
        return self.kv.delete(key).addCallback(popped)

    def cas(self, key: str, expected: Any, new: Any) -> Deferred:
        old = None if expected is None else self._encode(expected)
        value = None if new is None else self._encode(new)
        return self.kv.cas(key, old, value).addCallback(lambda r: r.ok)


class ReplicatedDict:
    """A dict-like view of the group's kv map (blocking; like PySyncObj's ``ReplDict``): ``d[k] = v``, ``d[k]``,
    ``del d[k]``, ``k in d``, ``d.get(k)``, ``d.cas(k, old, new)``.

    Reads are linearizable; every call is one round trip to the leader (nothing is cached), so the
    dict cannot be iterated or sized.  Values pass through ``codec``: ``"utf-8"`` (str, the default:
    what ``dledger kv`` reads and writes), ``"bytes"``, ``"json"``, or a pair of functions.  Pass
    ``client=`` an existing :class:`dledger.blocking.BlockingClient`, or the peers, group and
    ``BlockingClient`` options (``timeout``, ``credentials``, ...).  Errors are
    :class:`dledger.errors.DLedgerError`.  ``close()`` (or a ``with`` block) closes a client it made.
    """

    def __init__(self, peers: str | None = None, group: str | None = None, *, client=None, codec: Any = "utf-8",
                 **client_options: Any):
        if client is None:
            from dledger.blocking import BlockingClient

            if peers is None or group is None:
                raise ValueError("ReplicatedDict needs peers and group, or client=")
            client = BlockingClient(peers, group, **client_options)
            self._owns = True
        else:
            self._owns = False
        self.client = client
        self._encode, self._decode = _codec(codec)

    def _ask(self, code: int, body: bytes) -> Reply:
        return decode_reply(self.client.request(code, body, retry_ambiguous=True))

    def _write(self, op: Op) -> Reply:
        return self._ask(WRITE_CODE, encode_op(op))

    def read(self, key: str) -> Reply:
        """The :class:`Reply` of a linearizable read (``ok``, ``value`` as bytes, ``index`` it was read at)."""
        return self._ask(GET_CODE, encode_get(key))

    def __getitem__(self, key: str) -> Any:
        reply = self.read(key)
        if not reply.ok:
            raise KeyError(key)
        return self._decode(reply.value)

    def get(self, key: str, default: Any = None) -> Any:
        reply = self.read(key)
        return self._decode(reply.value) if reply.ok else default

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.read(key).ok

    def __setitem__(self, key: str, value: Any) -> None:
        self._write(Op("put", new_op_id(), key, self._encode(value)))

    def set(self, key: str, value: Any) -> None:
        """``d[key] = value`` (PySyncObj's name)."""
        self[key] = value

    def __delitem__(self, key: str) -> None:
        if not self._write(Op("delete", new_op_id(), key)).ok:
            raise KeyError(key)

    def pop(self, key: str, *default: Any) -> Any:
        """Delete ``key`` and return the value it held (``default``, or KeyError, if it was absent)."""
        reply = self._write(Op("delete", new_op_id(), key))
        if reply.ok:
            return self._decode(reply.value)
        if default:
            return default[0]
        raise KeyError(key)

    def cas(self, key: str, expected: Any, new: Any) -> bool:
        """Set ``key`` to ``new`` if it holds ``expected`` (None: if absent; ``new`` None: delete it); True if set."""
        old = None if expected is None else self._encode(expected)
        value = None if new is None else self._encode(new)
        return self._write(Op("cas", new_op_id(), key, value, old)).ok

    def close(self) -> None:
        if self._owns:
            self.client.close()

    def __enter__(self) -> ReplicatedDict:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
