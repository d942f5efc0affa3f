"""``dledger append | get | metadata | transfer | snapshot``: talk to a running group over TCP.

Every command takes the group's ``--peers`` and ``--group`` (or ``--config FILE``
of a member, or the ``DLEDGER_PEERS`` / ``DLEDGER_GROUP`` environment
variables), ``--timeout`` (seconds each request may take; a long append of
many entries is not cut short) and ``--json`` (one JSON object per line).
Errors exit with status 1 and print the DLedger code, e.g.
``dledger: NOT_LEADER (404): ...``; bad arguments exit with 2.  With
``--json`` an error is one JSON object on stdout instead:
``{"error": {"code": "NOT_LEADER", "number": 404, "message": "..."}, "status": 1}``.
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
from dledger.commands.argtypes import (
    add_secret_options,
    add_tls_options,
    non_negative_int,
    positive_float,
    positive_int,
)
from dledger.config import DLedgerConfig, load_toml, parse_peers
from dledger.entry import Entry
from dledger.errors import ConfigError, DLedgerError

#: Connection attempts wait at most this long (or ``--timeout`` if shorter).
CONNECT_TIMEOUT = 3.0
#: Exit status when the reader of stdout went away (``dledger metadata | head -1``): 128 + SIGPIPE,
#: as a shell reports a process killed by it.
EXIT_BROKEN_PIPE = 141


def client_parent() -> argparse.ArgumentParser:
    """The options every command that talks to a group takes: --peers/--group/--config/--timeout/--json and security.

    Pass it as ``parents=[client_parent()]`` to ``add_parser``, with ``set_defaults(func=command(action))``:
    a plugin's command (``dledger_cli_commands``) then finds the group, presents credentials and reports
    errors exactly as ``dledger append`` does.
    """
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("group")
    g.add_argument("--peers", default=os.environ.get("DLEDGER_PEERS"),
                   help="members as 'id-host:port;...' (default: $DLEDGER_PEERS or the --config file's)")
    g.add_argument("--group", default=os.environ.get("DLEDGER_GROUP"),
                   help="group name (default: $DLEDGER_GROUP or the --config file's)")
    g.add_argument("--config", help="a member's TOML config file, for its peers and group")
    g.add_argument("--timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help="seconds each request may wait for its answer (default 10); applies per request, not to "
                        "the whole command, so a long append of many entries is not cut short")
    g.add_argument("--json", action="store_true", help="print one JSON object per line")
    sec = common.add_argument_group("security (members with TLS or authMode tls/secret; docs/security.md)")
    add_tls_options(sec)
    add_secret_options(sec)
    return common


def register(subparsers) -> None:
    common = client_parent()
    p = subparsers.add_parser(
        "append", parents=[common], help="append entries to a running group",
        description="Append bodies: --body (repeatable), --file (one body per file), --count N generated bodies, "
                    "or else one body per line of stdin. Prints each entry's index, term and position once "
                    "it is committed. Delivery is at least once: a retried append may be stored twice.")
    p.add_argument("--body", action="append", default=[], help="a body (UTF-8 text); repeatable")
    p.add_argument("--file", action="append", default=[], help="a file whose bytes are one body; repeatable")
    p.add_argument("--count", type=positive_int, default=None, metavar="N", help="append N generated bodies")
    p.add_argument("--size", type=non_negative_int, default=0, help="pad generated bodies to this many bytes")
    p.add_argument("--batch", type=positive_int, nargs="?", const=256, default=None, metavar="N",
                   help="send the bodies as batch appends of N (default 256) entries each")
    p.add_argument("--member", help="send to this member only (no redirect to the leader)")
    p.set_defaults(func=command(do_append))

    p = subparsers.add_parser("get", parents=[common], help="read committed entries from the leader",
                              description="Read committed entries from --index on (NOOP entries are skipped).")
    p.add_argument("--index", type=non_negative_int, required=True, help="first index to read")
    p.add_argument("--count", type=positive_int, default=1, metavar="N", help="read up to N entries (default 1)")
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

    p = subparsers.add_parser(
        "snapshot", parents=[common], help="take a snapshot of the state machines now (admin role)",
        description="Ask every member (or --member) to snapshot its state machines now, then compact its log "
                    "below the snapshot's index minus trailingEntries and prune old snapshots "
                    "(docs/snapshots.md). Needs an admin client credential when authentication is on. Prints "
                    "one line per member; exits 1 if any member could not.")
    p.add_argument("--member", help="ask only this member")
    p.set_defaults(func=command(do_snapshot))


# -- running a command ------------------------------------------------------------------------
def command(action):
    """The argparse ``func`` of a client command: runs ``action`` under ``task.react`` and exits with its status.

    ``action`` is ``async def action(client, args, out) -> int | None``: ``client`` a connected
    :class:`dledger.client.DLedgerClient` (closed afterwards), ``out`` where to print.  A DLedgerError
    it raises is printed as one line (``dledger: CODE (n): ...``, or JSON with ``--json``) with status 1.
    """

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
    """Run ``action(client, args, out)`` against the group of ``args``; the exit status.

    ``--timeout`` bounds each request (and each connection attempt), not the command: the client's
    retries are bounded by their number, and a member that answers is never cut off mid-command.
    """
    from dledger.client import connect

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        peers, group = resolve_group(args)
        member = getattr(args, "member", None)
        limit = {"members": [member], "max_attempts": 1} if member else {}
        credentials = client_credentials(args, group)
        client = connect(peers, group, reactor=reactor, request_timeout=args.timeout,
                         connect_timeout=min(CONNECT_TIMEOUT, args.timeout), give_up_unreachable=True,
                         credentials=credentials, **limit)
    except (ConfigError, DLedgerError) as exc:
        return report_error(args, out, err, None, str(exc), 2)
    try:
        return int(await Deferred.fromCoroutine(action(client, args, out)) or 0)
    except ConfigError as exc:  # found before anything was sent (e.g. --file that cannot be read)
        return report_error(args, out, err, None, str(exc), 2)
    except (CancelledError, DeferredTimeout):
        return report_error(args, out, err, ResponseCode.TIMEOUT, f"no answer within {args.timeout:g}s", 1)
    except DLedgerError as exc:
        message = explain(exc, args)
        if exc.code in (ResponseCode.NETWORK_ERROR, ResponseCode.TIMEOUT):
            message = await tls_hint(reactor, client, credentials) or message
        return report_error(args, out, err, exc.code, message, 1)
    except BrokenPipeError:
        from dledger.cli import silence_stdout

        silence_stdout()
        return EXIT_BROKEN_PIPE
    finally:
        await client.close()


async def tls_hint(reactor, client, credentials, addresses: list[str] | None = None) -> str | None:
    """A connection failed: did we speak plaintext to a TLS port, or TLS to a plaintext one?  One line, or None.

    ``addresses``: the ports to ask (default: every member's).
    """
    from twisted.internet.threads import deferToThread

    from dledger.transport.probe import tls_mismatch

    if addresses is None:
        addresses = list(getattr(client.transport, "members", {}).values())
    using_tls = credentials is not None and credentials.tls_options is not None
    try:
        return await deferToThread(tls_mismatch, addresses, using_tls)
    except Exception:  # a hint is a bonus: never let it hide the real error
        return None


def report_error(args, out: TextIO, err: TextIO, code: ResponseCode | None, message: str, status: int) -> int:
    """Print one error: a line on stderr, or with ``--json`` one JSON object on stdout; returns ``status``.

    ``code`` is the DLedger code of a protocol error; None for a usage error (status 2).
    """
    if getattr(args, "json", False):
        error = {"code": code.name if code is not None else "USAGE", "number": int(code) if code is not None else None,
                 "message": message}
        print(json.dumps({"error": error, "status": status}, sort_keys=True), file=out)
    elif code is None:
        print(f"dledger: error: {message}", file=err)
    else:
        print(f"dledger: {code.name} ({int(code)}): {message}", file=err)
    return status


def explain(exc: DLedgerError, args) -> str:
    """What went wrong (:func:`error_detail`), plus what an operator needs to know about it."""
    text = error_detail(exc)
    if exc.code is ResponseCode.NOT_AUTHORIZED:
        have = "a certificate" if getattr(args, "tls_cert", None) else "a token" if getattr(args, "token_file", None) \
            else "no credentials"
        text += (f"; the members run with authentication and this client has {have}: pass --tls-ca/--tls-cert/"
                 "--tls-key (authMode=tls) or --client-name/--token-file (authMode=secret), and check its role in "
                 "the members' clientsFile (the member's log says why it refused)")
    if exc.code is ResponseCode.UNEXPECTED_ARGUMENT and getattr(args, "bodies", None):
        biggest = max(len(b) for b in args.bodies)
        limit = args.max_entry_size
        if limit is None:
            text += (f"; the largest body is {biggest} bytes: probably larger than maxEntrySize "
                     f"({DLedgerConfig.max_entry_size} unless the members' config says otherwise)")
        elif biggest + 48 > limit:
            text += f"; a body of {biggest} bytes is larger than maxEntrySize ({limit}) with its 48-byte header"
    return text


def describe_error(exc: DLedgerError) -> str:
    """``NOT_LEADER (404): from n1 (attempt 1); the leader is n0``."""
    detail = error_detail(exc)
    return f"{exc.code.name} ({int(exc.code)})" + (f": {detail}" if detail else "")


def error_detail(exc: DLedgerError) -> str:
    """The error's message without its code: ``from n1 (attempt 1); the leader is n0``."""
    text = exc.message
    if exc.code is ResponseCode.NOT_LEADER:
        text += f"; the leader is {exc.leader_id}" if exc.leader_id else "; no leader known"
    return text.lstrip("; ")


def client_credentials(args, group: str):
    """What the command presents to members (None: plain TCP, anonymous); ConfigError for unusable files."""
    from dledger.security.guard import ClientCredentials

    if (args.tls_cert or args.tls_key) and not args.tls_ca:
        raise ConfigError("--tls-cert/--tls-key need --tls-ca (the CA the members' certificates chain to)")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together")
    return ClientCredentials.for_client(group, name=args.client_name or "", token_file=args.token_file,
                                        tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key)


def resolve_group(args) -> tuple[str, str]:
    """``(peers, group)`` from --peers/--group, else --config, else the environment; ConfigError if missing."""
    peers, group = args.peers, args.group
    args.max_entry_size = None
    if args.config:
        cfg = load_toml(args.config)
        peers = peers or cfg.get("peers")
        group = group or cfg.get("group")
        args.max_entry_size = cfg.get("max_entry_size", DLedgerConfig.max_entry_size)
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
    """The bodies to append, read before anything is sent; ConfigError (exit 2) if there are none or a file fails."""
    bodies = [b.encode("utf-8") for b in args.body]
    for path in args.file:
        try:
            with open(path, "rb") as fh:
                bodies.append(fh.read())
        except OSError as exc:
            raise ConfigError(f"--file {path}: {exc.strerror}") from None
    for i in range(args.count or 0):
        body = f"dledger-cli entry {i}".encode()
        bodies.append(body.ljust(args.size, b".") if args.size > len(body) else body)
    if not bodies:
        if sys.stdin is None or sys.stdin.isatty():
            raise ConfigError("nothing to append: give --body, --file or --count, or pipe lines into stdin")
        bodies = [line.rstrip(b"\r\n") for line in sys.stdin.buffer]
        bodies = [b for b in bodies if b]
        if not bodies:
            raise ConfigError("nothing to append: stdin was empty (give --body, --file or --count)")
    return bodies


async def do_append(client, args, out) -> int:
    bodies = args.bodies = append_bodies(args)
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
    index, want, got = args.index, args.count, 0
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

    members = [args.member] if args.member else client.member_ids
    answers: dict[str, Any] = {}
    credentials = getattr(getattr(client.transport, "remoting", None), "credentials", None)
    for mid in members:
        try:
            answers[mid] = await ask(mid)
        except DLedgerError as exc:
            hint = None
            if exc.code in (ResponseCode.NETWORK_ERROR, ResponseCode.TIMEOUT):
                hint = await tls_hint(None, client, credentials, [client.transport.members[mid]])
            answers[mid] = DLedgerError(exc.code, hint) if hint else exc
    if args.member:
        resp = answers[args.member]
        if isinstance(resp, DLedgerError):
            raise resp
        emit(out, args, {"member": args.member, **meta_json(resp, args.member), "peers": resp.peers},
             f"{args.member}: {meta_text(resp, args.member)}; leader {resp.leader_id}")
        return 0
    leader = next((r.leader_id for r in answers.values() if not isinstance(r, DLedgerError) and r.leader_id), None)
    config = await configuration_of(client, leader, answers)
    for mid in config.ids if config is not None else ():
        if mid not in answers:  # a member added since --peers was written: ask it too
            try:
                answers[mid] = await ask(mid)
            except DLedgerError as exc:
                answers[mid] = exc
    addresses = client.transport.members
    # What the leader last heard from its followers' disks: shown even for a member that does not answer.
    lead_says = answers.get(leader)
    peer_disk = (getattr(lead_says, "peer_disk", None) or {}) if not isinstance(lead_says, DLedgerError) else {}
    if args.json:
        members_json = {mid: ({"address": addresses[mid], "error": describe_error(r), "disk": peer_disk.get(mid)}
                              if isinstance(r, DLedgerError)
                              else {"address": addresses[mid], **meta_json(r, mid, peer_disk.get(mid))})
                        for mid, r in answers.items()}
        for mid, doc in members_json.items():
            doc["membership"] = membership_of(config, mid)
        print(json.dumps({"group": client.group, "leader": leader, "members": members_json,
                          "configIndex": config.index if config is not None else None}, sort_keys=True), file=out)
    else:
        print(f"group {client.group}, leader {leader or '(none known)'}"
              + (f", configuration entry {config.index}" if config is not None else ""), file=out)
        for mid, r in answers.items():
            if isinstance(r, DLedgerError):
                what = f"unreachable: {describe_error(r)}" + (f"; leader says {peer_disk[mid]}" if mid in peer_disk
                                                              else "")
            else:
                what = meta_text(r, mid, peer_disk.get(mid))
            membership = membership_of(config, mid)
            print(f"  {mid:4} {addresses[mid]:21} " + (f"{membership:12} " if membership else "") + what, file=out)
    if all(isinstance(r, DLedgerError) for r in answers.values()):
        return 1
    return 0


async def configuration_of(client, leader: str | None, answers: dict[str, Any]) -> Any:
    """The configuration (members and roles) from the leader, else the first member that answers; None if
    nobody serves it (a Java DLedger member, an older dledger, a client without the admin role)."""
    asked = [leader] if leader in answers else []
    asked += [mid for mid, r in answers.items() if mid != leader and not isinstance(r, DLedgerError)]
    for mid in asked:
        try:
            return (await client.members(member=mid)).configuration
        except DLedgerError:
            continue
    return None


def membership_of(config: Any, member: str) -> str | None:
    """``voter``, ``learner`` or ``not a member`` in the configuration; None when it is not known."""
    if config is None:
        return None
    m = config.get(member)
    return "not a member" if m is None else m.role.value


def check(resp: Any) -> None:
    if resp.response_code is not ResponseCode.SUCCESS:
        raise DLedgerError(resp.response_code, "", leader_id=resp.leader_id)


def meta_json(resp: Any, member: str, leader_says: str | None = None) -> dict[str, Any]:
    """One member's metadata as JSON; fields a Java DLedger member does not send are null (role is inferred).

    ``disk`` is ``disk full`` / ``disk error`` while the member's store refuses writes (its own word, else
    what the leader last heard from it: ``leader_says``), null otherwise.
    """
    return {"group": resp.group, "leader": resp.leader_id, "role": resp.role or infer_role(resp, member),
            "term": resp.term,
            "begin": resp.ledger_begin_index, "end": resp.ledger_end_index, "committed": resp.committed_index,
            "disk": getattr(resp, "disk", None) or leader_says}


def meta_text(resp: Any, member: str, leader_says: str | None = None) -> str:
    """One member's metadata as text (``  disk full`` at the end while its store refuses writes).

    Java DLedger members answer only Java's fields (group, leaderId, term, peers): their role is worked
    out from ``leaderId`` and the log range is shown as unknown, instead of failing on the missing fields.
    """
    role = resp.role or infer_role(resp, member)
    if resp.ledger_end_index is None:
        return f"{role:9} term {resp.term}  (no log range: member does not report it, e.g. Java DLedger)"
    disk = getattr(resp, "disk", None) or leader_says
    return (f"{role:9} term {resp.term}  log {resp.ledger_begin_index}..{resp.ledger_end_index}  "
            f"committed {resp.committed_index}" + (f"  {disk}" if disk else ""))


def infer_role(resp: Any, member: str) -> str:
    """The role of ``member`` when its answer does not say (Java DLedger): from the ``leaderId`` it reports."""
    if not resp.leader_id:
        return "CANDIDATE"
    return "LEADER" if resp.leader_id == member else "FOLLOWER"


async def do_snapshot(client, args, out) -> int:
    from dledger.diskio import format_bytes

    members = [args.member] if args.member else client.member_ids
    if args.member and args.member not in client.member_ids:
        raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{args.member} is not one of {', '.join(client.member_ids)}")
    status = 0
    for mid in members:
        try:
            resp = await client.snapshot(mid)
        except DLedgerError as exc:
            status = 1
            emit(out, args, {"member": mid, "error": describe_error(exc)},
                 f"{mid}: no snapshot: {describe_error(exc)}")
            continue
        emit(out, args, {"member": mid, "index": resp.index, "term": resp.snapshot_term,
                         "bytes": resp.snapshot_bytes, "ledgerBeginIndex": resp.ledger_begin_index},
             f"{mid}: snapshot {resp.index}-{resp.snapshot_term} ({format_bytes(resp.snapshot_bytes)}); "
             f"log begins at {resp.ledger_begin_index}")
    return status


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
