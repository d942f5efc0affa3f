"""``dledger kv put/get/delete/cas``: the kv map from the command line (one request each, one line of output).

Exit status: 0 done; 1 a protocol error (printed as every ``dledger`` client command prints it:
``dledger: CODE (n): ...``); 2 a usage error; 3 the answer is "no": ``get`` of an absent key,
``delete`` of an absent key, a ``cas`` whose expected value did not match (with the value found).
Values are UTF-8 text (what :class:`ReplicatedDict` stores with its default codec).
"""

from __future__ import annotations

import json
import sys

from dledger.codes import ResponseCode
from dledger.errors import ConfigError, DLedgerError
from dledger_example.kv.client import KVClient
from dledger_example.kv.codec import check_key

#: The answer is "no" (absent key, cas mismatch): not an error, not a success.
EXIT_NO = 3


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "backslashreplace")


def _key(text: str) -> str:
    try:
        check_key(text)
    except ValueError as exc:
        import argparse

        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def register(subparsers) -> None:
    from dledger.commands.client import client_parent, command

    p = subparsers.add_parser(
        "kv", help="the replicated key-value map (example plugin; members need kv.enabled)",
        description="Read and write the group's replicated kv map (plugins/example, dledger_example.kv). The members "
                    "run it with --plugin-opt kv.enabled=true. Reads are linearizable: a get sees every write "
                    "acknowledged before it started. Exit status 3 means the answer is no (absent key, cas "
                    "mismatch).")
    actions = p.add_subparsers(dest="kv_command", metavar="ACTION")
    parent = client_parent()
    put = actions.add_parser("put", parents=[parent], help="set a key", description="Set KEY to VALUE (UTF-8 text).")
    put.add_argument("key", type=_key, help="the key (UTF-8 text, at most 1024 bytes)")
    put.add_argument("value", help="the value (UTF-8 text)")
    put.set_defaults(func=command(put_command))
    get = actions.add_parser("get", parents=[parent], help="read a key (linearizable)",
                             description="Print KEY's value; exit status 3 if it is absent.")
    get.add_argument("key", type=_key, help="the key")
    get.set_defaults(func=command(get_command))
    delete = actions.add_parser("delete", parents=[parent], help="remove a key",
                                description="Remove KEY; exit status 3 if it was absent.")
    delete.add_argument("key", type=_key, help="the key")
    delete.set_defaults(func=command(delete_command))
    cas = actions.add_parser("cas", parents=[parent], help="compare-and-set a key",
                             description="Set KEY to NEW if it holds --expect OLD (or, with --absent, if it is "
                                         "absent); exit status 3 with the value found if it does not.")
    cas.add_argument("key", type=_key, help="the key")
    cas.add_argument("new", help="the value to set (UTF-8 text)")
    which = cas.add_mutually_exclusive_group(required=True)
    which.add_argument("--expect", metavar="OLD", help="the value KEY must hold")
    which.add_argument("--absent", action="store_true", help="KEY must be absent")
    cas.set_defaults(func=command(cas_command))
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _print(args, out, record: dict, text: str) -> None:
    print(json.dumps(record, sort_keys=True) if args.json else text, file=out)


def _unsupported(exc: DLedgerError) -> DLedgerError:
    if exc.code is ResponseCode.UNSUPPORTED:
        return DLedgerError(exc.code, f"{exc.message}; do the members run the kv map (--plugin-opt "
                                      "kv.enabled=true, dledger-example installed)?", leader_id=exc.leader_id)
    return exc


async def _call(d):
    try:
        return await d
    except DLedgerError as exc:
        raise _unsupported(exc) from None
    except ValueError as exc:  # a reply this client cannot read
        raise ConfigError(f"kv: {exc}") from None


async def put_command(client, args, out):
    reply = await _call(KVClient(client).put(args.key, args.value.encode("utf-8")))
    _print(args, out, {"op": "put", "key": args.key, "index": reply.index}, f"put {args.key}: entry {reply.index}")
    return 0


async def get_command(client, args, out):
    reply = await _call(KVClient(client).read(args.key))
    if reply.ok or args.json:
        _print(args, out, {"op": "get", "key": args.key, "found": reply.ok, "value": _text(reply.value),
                           "index": reply.index}, _text(reply.value))
    else:
        print(f"dledger: kv: no key {args.key!r} (read at index {reply.index})", file=sys.stderr)
    return 0 if reply.ok else EXIT_NO


async def delete_command(client, args, out):
    reply = await _call(KVClient(client).delete(args.key))
    text = f"deleted {args.key}: entry {reply.index}" if reply.ok else f"{args.key} was absent: entry {reply.index}"
    _print(args, out, {"op": "delete", "key": args.key, "deleted": reply.ok, "index": reply.index}, text)
    return 0 if reply.ok else EXIT_NO


async def cas_command(client, args, out):
    expected = None if args.absent else args.expect.encode("utf-8")
    reply = await _call(KVClient(client).cas(args.key, expected, args.new.encode("utf-8")))
    if reply.ok:
        text = f"set {args.key}: entry {reply.index}"
    elif reply.value is None:
        text = f"cas {args.key} failed: it is absent (entry {reply.index})"
    else:
        text = f"cas {args.key} failed: it holds {_text(reply.value)!r} (entry {reply.index})"
    _print(args, out, {"op": "cas", "key": args.key, "set": reply.ok, "value": _text(reply.value),
                       "index": reply.index}, text)
    return 0 if reply.ok else EXIT_NO
