"""``dledger append | get | metadata | transfer``: talk to a running group over TCP.

Every command takes the group's ``--peers`` and ``--group`` (or ``--config FILE``
of a member, or the ``DLEDGER_PEERS`` / ``DLEDGER_GROUP`` environment
variables), ``--timeout`` (seconds for the whole command) and ``--json``
(one JSON object per line).  Errors exit with status 1 and print the DLedger
code, e.g. ``dledger: NOT_LEADER (404): ...``; bad arguments exit with 2.
The client finds the leader by itself and follows redirects; ``--member ID``
sends to that member only (no redirect), which shows what it answers.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import Any, TextIO

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.internet.task import react

from dledger.codes import ResponseCode
from dledger.config import load_toml, parse_peers
from dledger.entry import Entry
from dledger.errors import ConfigError, DLedgerError

#: Per-request timeout (the whole command is bounded by ``--timeout``).
REQUEST_TIMEOUT = 3.0


def register(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("group")
    g.add_argument("--peers", default=os.environ.get("DLEDGER_PEERS"),
                   help="members as 'id-host:port;...' (default: $DLEDGER_PEERS or the --config file's)")
    g.add_argument("--group", default=os.environ.get("DLEDGER_GROUP"),
                   help="group name (default: $DLEDGER_GROUP or the --config file's)")
    g.add_argument("--config", help="a member's TOML config file, for its peers and group")
    g.add_argument("--timeout", type=float, default=10.0, help="give up after this many seconds (default 10)")
    g.add_argument("--json", action="store_true", help="print one JSON object per line")

    p = subparsers.add_parser(
        "append", parents=[common], help="append entries to a running group",
        description="Append bodies: --body (repeatable), --file (one body per file), --count N generated bodies, "
                    "or else one body per line of stdin. Prints each entry's index, term and position once "
                    "it is committed. Delivery is at least once: a retried append may be stored twice.")
    p.add_argument("--body", action="append", default=[], help="a body (UTF-8 text); repeatable")
    p.add_argument("--file", action="append", default=[], help="a file whose bytes are one body; repeatable")
    p.add_argument("--count", type=int, default=0, help="append N generated bodies")
    p.add_argument("--size", type=int, default=0, help="pad generated bodies to this many bytes")
    p.add_argument("--batch", type=int, nargs="?", const=256, default=0, metavar="N",
                   help="send the bodies as batch appends of N (default 256) entries each")
    p.add_argument("--member", help="send to this member only (no redirect to the leader)")
    p.set_defaults(func=command(do_append))

    p = subparsers.add_parser("get", parents=[common], help="read committed entries from the leader",
                              description="Read committed entries from --index on (NOOP entries are skipped).")
    p.add_argument("--index", type=int, required=True, help="first index to read")
    p.add_argument("--count", type=int, default=1, help="read up to N entries (default 1)")
    p.add_argument("--member", help="ask this member only (no redirect to the leader)")
    p.set_defaults(func=command(do_get))

    p = subparsers.add_parser("metadata", parents=[common], help="show the members' roles, terms and indexes",
                              description="Ask every member (or --member) for its role, term, log range and "
                                          "committed index.")
    p.add_argument("--member", help="ask only this member")
    p.set_defaults(func=command(do_metadata))

    p = subparsers.add_parser("transfer", parents=[common], help="move leadership to another member",
                              description="Ask the leader to hand leadership to --to once it is caught up.")
    p.add_argument("--to", required=True, help="the member to become leader")
    p.set_defaults(func=command(do_transfer))


# -- running a command ------------------------------------------------------------------------
def command(action):
    """The argparse ``func`` of a client command: runs ``action`` under ``task.react`` and exits with its status."""

    def run(args) -> int:
        status = [1]

        def main(reactor):
            d = Deferred.fromCoroutine(run_command(reactor, action, args))
            d.addCallback(lambda code: status.__setitem__(0, code))
            return d

        try:
            react(main)
        except SystemExit:
            pass
        return status[0]

    return run


async def run_command(reactor, action, args, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``action(client, args, out)`` against the group of ``args`` within ``args.timeout``; the exit status."""
    from dledger.client import connect

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        peers, group = resolve_group(args)
        member = getattr(args, "member", None)
        limit = {"members": [member], "max_attempts": 1} if member else {}
        client = connect(peers, group, reactor=reactor, request_timeout=min(REQUEST_TIMEOUT, args.timeout),
                         **limit)
    except (ConfigError, DLedgerError) as exc:
        print(f"dledger: error: {exc}", file=err)
        return 2
    d = Deferred.fromCoroutine(action(client, args, out))
    d.addTimeout(args.timeout, reactor)
    try:
        return int(await d or 0)
    except (CancelledError, DeferredTimeout):
        print(f"dledger: {ResponseCode.TIMEOUT.name} ({int(ResponseCode.TIMEOUT)}): no answer within "
              f"{args.timeout:g}s", file=err)
        return 1
    except DLedgerError as exc:
        print(f"dledger: {describe_error(exc)}", file=err)
        return 1
    finally:
        await client.close()


def describe_error(exc: DLedgerError) -> str:
    """``NOT_LEADER (404): from n1 (attempt 1); the leader is n0``."""
    text = f"{exc.code.name} ({int(exc.code)})"
    if exc.message:
        text += f": {exc.message}"
    if exc.code is ResponseCode.NOT_LEADER:
        text += f"; the leader is {exc.leader_id}" if exc.leader_id else "; no leader known"
    return text


def resolve_group(args) -> tuple[str, str]:
    """``(peers, group)`` from --peers/--group, else --config, else the environment; ConfigError if missing."""
    peers, group = args.peers, args.group
    if args.config:
        cfg = load_toml(args.config)
        peers = peers or cfg.get("peers")
        group = group or cfg.get("group")
    if not peers:
        raise ConfigError("no members given: pass --peers 'n0-host:port;...' (or --config FILE, or set "
                          "DLEDGER_PEERS)")
    if not group:
        raise ConfigError("no group given: pass --group NAME (or --config FILE, or set DLEDGER_GROUP)")
    parse_peers(peers)
    member = getattr(args, "member", None)
    for who in (member, getattr(args, "to", None)):
        if who is not None and who not in parse_peers(peers):
            raise ConfigError(f"{who!r} is not one of the members {list(parse_peers(peers))}")
    return peers, group


# -- output -------------------------------------------------------------------------------------
def entry_json(entry: Entry) -> dict[str, Any]:
    """An entry as JSON: body in Base64, and as text when it is printable UTF-8."""
    return {"index": entry.index, "term": entry.term, "pos": entry.pos, "size": entry.size,
            "body_base64": base64.b64encode(entry.body).decode("ascii"), "body": printable(entry.body)}


def printable(body: bytes) -> str | None:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def emit(out: TextIO, args, obj: dict[str, Any], text: str) -> None:
    print(json.dumps(obj, sort_keys=True) if args.json else text, file=out)


# -- commands -----------------------------------------------------------------------------------
def append_bodies(args) -> list[bytes]:
    bodies = [b.encode("utf-8") for b in args.body]
    for path in args.file:
        try:
            with open(path, "rb") as fh:
                bodies.append(fh.read())
        except OSError as exc:
            raise ConfigError(f"--file {path}: {exc.strerror}") from None
    for i in range(args.count):
        body = f"dledger-cli entry {i}".encode()
        bodies.append(body.ljust(args.size, b".") if args.size > len(body) else body)
    if not bodies:
        if sys.stdin is None or sys.stdin.isatty():
            raise ConfigError("nothing to append: give --body, --file or --count, or pipe lines into stdin")
        bodies = [line.rstrip(b"\r\n") for line in sys.stdin.buffer]
        bodies = [b for b in bodies if b]
        if not bodies:
            raise ConfigError("nothing to append: stdin was empty")
    return bodies


async def do_append(client, args, out) -> int:
    bodies = append_bodies(args)
    if args.batch:
        for start in range(0, len(bodies), args.batch):
            chunk = bodies[start:start + args.batch]
            resp = await (client.append_batch(chunk) if len(chunk) > 1 else client.append(chunk[0]))
            first = resp.index - len(chunk) + 1
            emit(out, args, {"index": resp.index, "first_index": first, "count": len(chunk), "term": resp.term,
                             "pos": resp.pos},
                 f"appended {len(chunk)} entries: index {first}..{resp.index} term {resp.term} "
                 f"(last at pos {resp.pos})")
        return 0
    for body in bodies:
        resp = await client.append(body)
        emit(out, args, {"index": resp.index, "term": resp.term, "pos": resp.pos},
             f"appended index={resp.index} term={resp.term} pos={resp.pos}")
    return 0


async def do_get(client, args, out) -> int:
    index, want, got = args.index, max(1, args.count), 0
    while got < want:
        try:
            entries = await client.get(index, want - got)
        except DLedgerError as exc:
            if got and exc.code is ResponseCode.INDEX_OUT_OF_RANGE:
                break  # read up to the committed end
            raise
        if not entries:
            break
        for e in entries[:want - got]:
            text = printable(e.body)
            shown = repr(text) if text is not None else f"<{len(e.body)} bytes> {e.body[:32].hex()}"
            emit(out, args, entry_json(e), f"index={e.index} term={e.term} pos={e.pos} body={shown}")
            got += 1
        index = entries[-1].index + 1
    return 0


async def do_metadata(client, args, out) -> int:
    from dledger.messages import MetadataRequest

    async def ask(mid: str) -> Any:
        resp = await client.transport.send(mid, MetadataRequest(group=client.group, remote_id=mid, detail=True),
                                           timeout=client.request_timeout)
        check(resp)
        return resp

    members = [args.member] if args.member else client.members
    answers: dict[str, Any] = {}
    for mid in members:
        try:
            answers[mid] = await ask(mid)
        except DLedgerError as exc:
            answers[mid] = exc
    if args.member:
        resp = answers[args.member]
        if isinstance(resp, DLedgerError):
            raise resp
        emit(out, args, {"member": args.member, **meta_json(resp), "peers": resp.peers},
             f"{args.member}: {meta_text(resp)}; leader {resp.leader_id}")
        return 0
    leader = next((r.leader_id for r in answers.values() if not isinstance(r, DLedgerError) and r.leader_id), None)
    addresses = client.transport.members
    if args.json:
        members_json = {mid: ({"address": addresses[mid], "error": describe_error(r)} if isinstance(r, DLedgerError)
                              else {"address": addresses[mid], **meta_json(r)}) for mid, r in answers.items()}
        print(json.dumps({"group": client.group, "leader": leader, "members": members_json}, sort_keys=True),
              file=out)
    else:
        print(f"group {client.group}, leader {leader or '(none known)'}", file=out)
        for mid, r in answers.items():
            what = f"unreachable: {describe_error(r)}" if isinstance(r, DLedgerError) else meta_text(r)
            print(f"  {mid:4} {addresses[mid]:21} {what}", file=out)
    if all(isinstance(r, DLedgerError) for r in answers.values()):
        return 1
    return 0


def check(resp: Any) -> None:
    if resp.response_code is not ResponseCode.SUCCESS:
        raise DLedgerError(resp.response_code, "", leader_id=resp.leader_id)


def meta_json(resp: Any) -> dict[str, Any]:
    return {"group": resp.group, "leader": resp.leader_id, "role": resp.role, "term": resp.term,
            "begin": resp.ledger_begin_index, "end": resp.ledger_end_index, "committed": resp.committed_index}


def meta_text(resp: Any) -> str:
    return (f"{resp.role:9} term {resp.term}  log {resp.ledger_begin_index}..{resp.ledger_end_index}  "
            f"committed {resp.committed_index}")


async def do_transfer(client, args, out) -> int:
    meta = await client.find_leader()
    if meta.leader_id == args.to:
        emit(out, args, {"from": args.to, "to": args.to, "term": meta.term},
             f"{args.to} is already the leader (term {meta.term})")
        return 0
    resp = await client.transfer(args.to)
    emit(out, args, {"from": meta.leader_id, "to": args.to, "term": resp.term},
         f"leadership moved from {meta.leader_id} to {args.to} (term {resp.term})")
    return 0
