"""``dledger rocketmq send|pull|offsets|inspect``: the plugin's sub-commands (added by ``dledger_cli_commands``).

``send``, ``pull`` and ``offsets`` talk to one member's broker port (``ADDR`` =
its ``rocketmq.listen`` host:port) with the blocking client; ``inspect DIR``
reads a broker store offline (topics, queues with min/max offsets, consumer
offsets, the last messages).  One-line errors: bad arguments exit 2, a broker
error or an unreachable port exits 1.  ``--json`` prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from dledger.commands.argtypes import add_tls_options
from dledger_rocketmq.broker.broker import parse_host

PROG = "dledger rocketmq"


def _fail(text: str, status: int = 1) -> int:
    print(f"{PROG}: error: {text}", file=sys.stderr)
    return status


def _non_negative(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return n


def _positive(value: str) -> int:
    n = int(value)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return n


def _addr(value: str) -> tuple[str, int]:
    try:
        a = parse_host(value)
        a.packed()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"ADDR must be ip:port of a broker port ({exc})") from None
    return a.host, a.port


def register(subparsers) -> None:
    """Add ``dledger rocketmq`` and its sub-commands."""
    p = subparsers.add_parser("rocketmq", help="talk to a RocketMQ broker port, inspect a broker store",
                              description="RocketMQ plugin tools: send/pull/offsets through a member's broker port "
                                          "(rocketmq.listen), inspect a broker store directory offline.")
    sub = p.add_subparsers(dest="rocketmq_command", metavar="COMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    def common(sp, addr: bool = True, addr_help: str = "the broker port, ip:port"):
        if addr:
            sp.add_argument("addr", metavar="ADDR", type=_addr, help=addr_help)
            sp.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each answer")
            sec = sp.add_argument_group("security (rocketmq.aclEnable, rocketmq.tlsClientAuth; docs/rocketmq.md "
                                        "\"ACL\")")
            sec.add_argument("--access-key", default=os.environ.get("DLEDGER_ROCKETMQ_ACCESS_KEY"),
                             help="RocketMQ ACL account to sign requests with, for --secret-key-file (default "
                                  "$DLEDGER_ROCKETMQ_ACCESS_KEY)")
            sec.add_argument("--secret-key-file", default=os.environ.get("DLEDGER_ROCKETMQ_SECRET_KEY_FILE"),
                             help="file whose first line is the account's secretKey (default "
                                  "$DLEDGER_ROCKETMQ_SECRET_KEY_FILE)")
            add_tls_options(sec, peer="the broker's")
        sp.add_argument("--json", action="store_true", help="print JSON")

    s = sub.add_parser("send", help="send messages (one SEND_MESSAGE_V2 each, or one SEND_BATCH_MESSAGE)")
    common(s)
    s.add_argument("topic")
    s.add_argument("bodies", metavar="BODY", nargs="+", help="message bodies (UTF-8 text)")
    s.add_argument("--tags", help="TAGS property")
    s.add_argument("--keys", help="KEYS property (space-separated keys)")
    s.add_argument("--queue", type=_non_negative, default=0, help="queue id (default 0)")
    s.add_argument("--batch", action="store_true", help="send all bodies as one batch")
    s.set_defaults(func=cmd_send)

    pl = sub.add_parser("pull", help="pull messages of one queue")
    common(pl)
    pl.add_argument("group")
    pl.add_argument("topic")
    pl.add_argument("--queue", type=_non_negative, default=0, help="queue id (default 0)")
    pl.add_argument("--offset", type=_non_negative, help="queue offset (default: the group's committed offset)")
    pl.add_argument("--max", type=_positive, default=32, help="most messages to pull (default 32)")
    pl.add_argument("--tags", default="*", help="tag expression, e.g. 'A || B' (default *)")
    pl.add_argument("--commit", action="store_true", help="commit the group's offset past what was pulled")
    pl.set_defaults(func=cmd_pull)

    o = sub.add_parser("offsets", help="min/max offsets of a topic's queues and a group's committed offsets")
    common(o)
    o.add_argument("topic")
    o.add_argument("--queues", type=_positive, default=4, help="queues 0..N-1 to show (default 4)")
    o.add_argument("--group", help="also show this consumer group's committed offsets")
    o.add_argument("--set", metavar="QUEUE=OFFSET", action="append", default=[],
                   help="commit OFFSET for --group in QUEUE (repeatable)")
    o.set_defaults(func=cmd_offsets)

    i = sub.add_parser("inspect", help="a broker store directory offline: topics, queues, offsets, last messages")
    common(i, addr=False)
    i.add_argument("dir", metavar="DIR", help="the broker store root (consumequeue/, config/)")
    i.add_argument("--last", type=_non_negative, default=3, help="last messages shown per queue (default 3)")
    i.add_argument("--data-root", help="where dledger-<id>/data is (default: DIR, then DIR's parent)")
    i.add_argument("--self-id", help="which dledger-<id> to read when there are several")
    i.set_defaults(func=cmd_inspect)

    m = sub.add_parser("migrate-check", help="is the next step of a live migration safe? (every broker of the "
                       "group caught up, consumer and delay offsets synced)",
                       description="Asks a running broker group (Java brokers, dledger members or both) through a "
                                   "name server: every slave has indexed what the master has, its consumer offsets "
                                   "are within --max-offset-lag of the master's, no slave's delay offset is ahead "
                                   "of the master's. One line: 'safe: ...' (exit 0) or 'not safe: ...' (exit 1). "
                                   "docs/rocketmq.md 'Migrating a RocketMQ DLedger group'.")
    common(m, addr_help="a name server the group registers with, ip:port")
    m.add_argument("broker_name", metavar="BROKER_NAME", help="the group's brokerName")
    m.add_argument("--members", type=_positive, help="brokers the group should have registered (default: no check)")
    m.add_argument("--max-offset-lag", type=_non_negative, default=100,
                   help="largest consumer-offset lag of a slave, in messages (default 100; the slave sync runs "
                        "every 10 s, so 0 only holds with consumers stopped)")
    m.set_defaults(func=cmd_migrate_check)


class UsageProblem(ValueError):
    """Options that do not go together, or a credentials file that cannot be used (exit 2, one line)."""


def client_options(args) -> dict[str, Any]:
    """``credentials`` and ``tls_options`` for the client from the security options (UsageProblem if unusable)."""
    from dledger.security.tls import TLSConfigError
    from dledger_rocketmq.client.client import tls_options
    from dledger_rocketmq.common.acl import AclConfigError, Credentials

    kw: dict[str, Any] = {}
    if bool(args.access_key) != bool(args.secret_key_file):
        raise UsageProblem("--access-key and --secret-key-file go together")
    if (args.tls_cert or args.tls_key) and not args.tls_ca:
        raise UsageProblem("--tls-cert/--tls-key need --tls-ca (the CA the broker's certificate chains to)")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageProblem("--tls-cert and --tls-key go together")
    try:
        if args.access_key:
            kw["credentials"] = Credentials.from_file(args.access_key, args.secret_key_file)
        if args.tls_ca:
            kw["tls_options"] = tls_options(args.tls_ca, args.tls_cert, args.tls_key)
    except (AclConfigError, TLSConfigError) as exc:
        raise UsageProblem(str(exc)) from None
    return kw


def _client(args):
    from dledger_rocketmq.client.client import BlockingRocketMQClient

    host, port = args.addr
    return BlockingRocketMQClient(host, port, timeout=args.timeout, **client_options(args))


def _run(args, fn) -> int:
    """Connect, run ``fn(client)``, map failures to one line (exit 1; unusable options: exit 2)."""
    from twisted.internet.error import ConnectError

    from dledger_rocketmq.client.client import RocketMQError

    try:
        client = _client(args)
    except UsageProblem as exc:
        return _fail(str(exc), 2)
    except (ConnectError, OSError, RocketMQError) as exc:
        return _fail(f"cannot connect to {args.addr[0]}:{args.addr[1]}: {exc}")
    try:
        return fn(client)
    except RocketMQError as exc:
        return _fail(f"broker answered {exc}")
    finally:
        client.close()


def _print(args, obj: Any, lines: list[str]) -> None:
    if args.json:
        print(json.dumps(obj, indent=2, sort_keys=True))
    else:
        for line in lines:
            print(line)


def cmd_send(args) -> int:
    bodies = [b.encode("utf-8") for b in args.bodies]

    def go(c) -> int:
        if args.batch:
            results = [c.send_batch(args.topic, bodies, tags=args.tags, queue_id=args.queue)]
        else:
            results = [c.send(args.topic, b, tags=args.tags, keys=args.keys, queue_id=args.queue) for b in bodies]
        out = [{"msgId": r.msg_id, "queueId": r.queue_id, "queueOffset": r.queue_offset} for r in results]
        _print(args, out, [f"sent {r.msg_id} queue {r.queue_id} offset {r.queue_offset}" for r in results])
        return 0
    return _run(args, go)


def _message_json(m) -> dict[str, Any]:
    return {"queueOffset": m.queue_offset, "physicalOffset": m.physical_offset, "msgId": m.message_id,
            "tags": m.tags, "keys": m.keys, "storeTimestamp": m.store_timestamp,
            "body": m.body.decode("utf-8", "replace")}


def cmd_pull(args) -> int:
    def go(c) -> int:
        offset = args.offset if args.offset is not None else c.query_offset(args.group, args.topic, args.queue)
        r = c.pull(args.group, args.topic, args.queue, offset, args.max, subscription=args.tags)
        if args.commit and r.code == 0:
            c.commit_offset(args.group, args.topic, args.queue, r.next_begin_offset)
        obj = {"code": r.code, "status": r.status, "offset": offset, "nextBeginOffset": r.next_begin_offset,
               "minOffset": r.min_offset, "maxOffset": r.max_offset, "messages": [_message_json(m) for m in r.messages]}
        lines = [f"{r.status}: {len(r.messages)} message(s) from offset {offset}, next {r.next_begin_offset} "
                 f"(queue {r.min_offset}..{r.max_offset})"]
        lines += [f"  {m.queue_offset} {m.message_id} tags={m.tags or '-'} {m.body.decode('utf-8', 'replace')!r}"
                  for m in r.messages]
        _print(args, obj, lines)
        return 0
    return _run(args, go)


def cmd_offsets(args) -> int:
    sets = []
    for item in args.set:
        q, _, off = item.partition("=")
        if not (q.isdigit() and off.isdigit()):
            return _fail(f"--set expects QUEUE=OFFSET with non-negative integers, got {item!r}", 2)
        sets.append((int(q), int(off)))
    if sets and not args.group:
        return _fail("--set needs --group", 2)

    def go(c) -> int:
        for q, off in sets:
            c.commit_offset(args.group, args.topic, q, off)
        rows = []
        for q in range(args.queues):
            row = {"queueId": q, "minOffset": c.min_offset(args.topic, q), "maxOffset": c.max_offset(args.topic, q)}
            if args.group:
                row["consumerOffset"] = c.query_offset(args.group, args.topic, q)
            rows.append(row)
        lines = [f"queue {r['queueId']}: min {r['minOffset']} max {r['maxOffset']}"
                 + (f" {args.group} {r['consumerOffset']}" if args.group else "") for r in rows]
        _print(args, rows, lines)
        return 0
    return _run(args, go)


def inspect_store(root: Path, *, last: int = 3, data_root: Path | None = None, self_id: str | None = None
                  ) -> dict[str, Any]:
    """What ``inspect`` shows, as a dict (StoreError subclasses for unusable files)."""
    from dledger_rocketmq.common.errors import CodecError
    from dledger_rocketmq.store.consumequeue import ConsumeQueues
    from dledger_rocketmq.store.metadata import BrokerMetadata
    from dledger_rocketmq.store.migration import StoreReader

    cq_size = None
    for f in sorted((root / "consumequeue").glob("*/*/*")):
        if f.is_file():
            cq_size = f.stat().st_size
            break
    queues = ConsumeQueues(root, file_size=cq_size) if cq_size else None
    meta = BrokerMetadata(root)
    meta.load()
    reader = None
    if self_id is None and root.name.startswith("rocketmq-"):  # the plugin's default <storeBaseDir>/rocketmq-<id>
        self_id = root.name[len("rocketmq-"):]
    for base in ([data_root] if data_root else [root, root.parent]):
        data_dirs = sorted(base.glob(f"dledger-{self_id}/data" if self_id else "dledger-*/data"))
        if data_dirs:
            first = next((p for p in sorted(data_dirs[0].iterdir()) if p.is_file()), None)
            size = first.stat().st_size if first else None
            reader = StoreReader(base, self_id=self_id, commitlog_file_size=size or 1 << 30)
            break
    out_queues = []
    for q in (queues.queues() if queues else []):
        row: dict[str, Any] = {"topic": q.topic, "queueId": q.queue_id, "minOffset": q.min_offset,
                               "maxOffset": q.max_offset, "last": []}
        if reader is not None and last:
            for qoff, unit in q.read(max(q.min_offset, q.max_offset - last), last):
                if unit.is_filler:
                    continue
                try:
                    m = reader.get_record(unit.physical_offset)
                    row["last"].append({**_message_json(m), "queueOffset": qoff})
                except CodecError as exc:
                    row["last"].append({"queueOffset": qoff, "error": str(exc)})
        out_queues.append(row)
    return {"store": str(root), "commitlog": str(reader.dledger_dir) if reader and reader.dledger_dir else None,
            "topics": _topic_names(root, meta),
            "queues": out_queues,
            "consumerOffsets": [c._asdict() for c in meta.offsets.items()]}


def _topic_names(root: Path, meta) -> list[str]:
    """The topics of ``config/topics.json`` as written (the loaded table also holds this tool's defaults)."""
    from dledger_rocketmq.common import fastjson

    try:
        data = fastjson.loads((root / "config" / "topics.json").read_bytes())
        return sorted(data["topicConfigTable"])
    except (OSError, ValueError, KeyError, TypeError):  # missing or damaged (.bak used): the loaded table
        return sorted(meta.topics.to_dict().get("topicConfigTable", {}))


def cmd_inspect(args) -> int:
    from dledger.errors import StoreError
    from dledger_rocketmq.common.errors import CodecError

    root = Path(args.dir)
    if not root.is_dir():
        return _fail(f"{root}: not a directory", 2)
    try:
        info = inspect_store(root, last=args.last, data_root=Path(args.data_root) if args.data_root else None,
                             self_id=args.self_id)
    except (StoreError, CodecError, OSError, ValueError) as exc:
        return _fail(f"{root}: {exc}", 2)
    lines = [f"store {info['store']} (CommitLog: {info['commitlog'] or 'not found'})",
             f"topics: {', '.join(info['topics'])}"]
    for q in info["queues"]:
        lines.append(f"queue {q['topic']}/{q['queueId']}: min {q['minOffset']} max {q['maxOffset']}")
        for m in q["last"]:
            lines.append(f"  {m['queueOffset']} " + (f"error: {m['error']}" if "error" in m else
                                                     f"{m['msgId']} tags={m['tags'] or '-'} {m['body']!r:.60}"))
    lines.append("consumer offsets:" + ("" if info["consumerOffsets"] else " none"))
    lines += [f"  {c['group']} {c['topic']}/{c['queue_id']}: {c['offset']}" for c in info["consumerOffsets"]]
    _print(args, info, lines)
    return 0


def cmd_migrate_check(args) -> int:
    from twisted.internet.defer import ensureDeferred

    from dledger.blocking import ReactorThread
    from dledger_rocketmq.client import migrate_check
    from dledger_rocketmq.client.client import connect

    try:
        kw = client_options(args)
    except UsageProblem as exc:
        return _fail(str(exc), 2)
    namesrv = f"{args.addr[0]}:{args.addr[1]}"
    thread = ReactorThread("rocketmq-migrate-check")

    def dial(addr: str):
        a = parse_host(addr)
        return connect(thread.reactor, a.host, a.port, timeout=args.timeout, **kw)

    try:
        views = thread.call(lambda: ensureDeferred(migrate_check.gather(dial, namesrv, args.broker_name)),
                            args.timeout * 10)
    except Exception as exc:
        return _fail(f"cannot check {args.broker_name} through {namesrv}: {str(exc) or type(exc).__name__}")
    finally:
        thread.stop()
    verdict = migrate_check.assess(args.broker_name, views, members=args.members, max_offset_lag=args.max_offset_lag)
    obj = {"safe": verdict.safe, "line": verdict.line, "reasons": verdict.reasons, **verdict.figures,
           "brokers": {str(i): {"addr": v.addr, "error": v.error} for i, v in sorted(views.items())}}
    _print(args, obj, [verdict.line])
    return 0 if verdict.safe else 1
