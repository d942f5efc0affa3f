"""``dledger store verify`` and ``dledger store dump``: look inside a store without changing it.

Both take a member directory (``dledger-<id>``), its ``lmdb/`` directory or
a ``storeBaseDir`` holding one member, and work out whether it is an mmap
or an LMDB store.  Files are opened read-only; nothing is repaired, and no
lock is taken (a running member is only noted).  ``dledger store
reset-vote`` is the one writer: it takes the store's lock, so it refuses a
store a member is running on.
"""

from __future__ import annotations

import base64
import json
import sys

from dledger.commands.argtypes import non_negative_int, positive_int
from dledger.errors import StoreError
from dledger.store import offline, ownership


def register(subparsers) -> None:
    p = subparsers.add_parser("store", help="verify or dump a store on disk (read-only)",
                              description="Inspect a member's store without modifying it.")
    sub = p.add_subparsers(dest="store_command", metavar="ACTION")

    v = sub.add_parser("verify", help="check every entry, index record and file; exit 1 on corruption",
                       description="Walk a whole store (mmap or LMDB) and report entries, begin/end/committed "
                                   "index, files and the first problem found. Exit status 0 if sound, 1 if "
                                   "anything is damaged or torn, 2 if the store cannot be read at all.")
    _common(v)
    v.add_argument("--json", action="store_true", help="print the report as one JSON object")
    v.set_defaults(func=cmd_verify)

    d = sub.add_parser("dump", help="print entries",
                       description="Print entries (verified as they are read), one per line, or as JSON lines "
                                   "with the body in base64 and as text when it is printable.")
    _common(d)
    d.add_argument("--from", dest="start", type=non_negative_int, default=None, metavar="I",
                   help="first index (default: begin)")
    d.add_argument("--to", dest="stop", type=non_negative_int, default=None, metavar="J",
                   help="last index (default: end)")
    d.add_argument("--json", action="store_true", help="JSON lines")
    d.set_defaults(func=cmd_dump)

    r = sub.add_parser("reset-vote", help="set a lost or damaged term/vote record to a safe term with no vote",
                       description="Write the term/vote record (mmap: currterm; LMDB: its termvote record) of a "
                                   "STOPPED member: term N, no vote. A member whose record is missing or damaged "
                                   "refuses to start, since starting at term 0 could make it vote twice in a term; "
                                   "its error line names this command with the smallest safe N (the last log "
                                   "term + 1). Prefer the group's current term + 1 (dledger metadata) when it is "
                                   "higher. A smaller N is refused; so is a store a running member holds.")
    r.add_argument("dir", help="member dir (dledger-<id>), its lmdb/ dir, or the storeBaseDir holding one member")
    r.add_argument("--term", type=int, required=True, metavar="N",
                   help="the new term (at least the last log term + 1 and above any term still readable)")
    r.add_argument("--type", choices=offline.KINDS, default=None, help="store type (default: detected)")
    r.set_defaults(func=cmd_reset_vote)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _common(p) -> None:
    p.add_argument("dir", help="member dir (dledger-<id>), its lmdb/ dir, or the storeBaseDir holding one member")
    p.add_argument("--type", choices=offline.KINDS, default=None, help="store type (default: detected)")
    p.add_argument("--data-file-size", type=positive_int, default=None, metavar="BYTES",
                   help="mmap data file size (default: the size of the files found)")
    p.add_argument("--index-file-size", type=positive_int, default=None, metavar="BYTES",
                   help="mmap index file size (default: the size of the files found)")
    # Members accept bodyCrc 0 as "unverified" by default (acceptJavaZeroCrc = true: entries a Java
    # leader pushed carry it), so the tools read what a member reads; --strict-crc checks like a
    # member configured with acceptJavaZeroCrc = false.
    crc = p.add_mutually_exclusive_group()
    crc.add_argument("--strict-crc", dest="java_compat", action="store_false",
                     help="refuse bodyCrc 0 (as a member with acceptJavaZeroCrc = false does)")
    crc.add_argument("--java-compat", dest="java_compat", action="store_true",
                     help="accept bodyCrc 0 as unverified, as members do by default (the default; kept for scripts)")
    p.set_defaults(java_compat=True)


def cmd_verify(args) -> int:
    kind, path = offline.locate(args.dir, args.type)
    if kind == "lmdb":
        report = offline.verify_lmdb(path, accept_zero_crc=args.java_compat)
    else:
        report = offline.verify_mmap(path, data_file_size=args.data_file_size,
                                     index_file_size=args.index_file_size, accept_zero_crc=args.java_compat)
    if args.json:
        print(json.dumps(report.as_dict(), sort_keys=True))
        return 0 if report.ok else 1
    print(f"store:     {report.kind} at {report.path}")
    if report.end >= 0:
        print(f"entries:   {report.entries} (begin {report.begin}, end {report.end}, end term {report.end_term})")
    else:
        print("entries:   0 (empty)")
    committed = "unknown" if report.committed is None else f"{report.committed} ({report.committed_source})"
    print(f"committed: {committed}")
    print(f"identity:  {ownership.describe_identity(report.identity)}")
    for line in report.files:
        print(f"files:     {line}")
    for note in report.notes:
        print(f"note:      {note}")
    if report.ok:
        print("status:    OK")
        return 0
    at = f" [{report.problem_at}]" if report.problem_at and f"[{report.problem_at}" not in report.problems[0] else ""
    print(f"status:    CORRUPT: {report.problems[0]}{at}")
    if len(report.problems) > 1:
        print(f"           (+{len(report.problems) - 1} more problems)")
    return 1


def _text(body: bytes) -> str | None:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if all(c.isprintable() or c in "\t\r\n" for c in text) else None


def cmd_dump(args) -> int:
    kind, path = offline.locate(args.dir, args.type)
    if kind == "lmdb":
        entries = offline.iter_lmdb(path, args.start, args.stop, accept_zero_crc=args.java_compat)
    else:
        entries = offline.iter_mmap(path, args.start, args.stop, data_file_size=args.data_file_size,
                                    index_file_size=args.index_file_size, accept_zero_crc=args.java_compat)
    member_dir = lmdb_member_dir(path) if kind == "lmdb" else path
    print(f"dledger: {kind} store {path}; identity: {ownership.describe_identity(ownership.read_identity(member_dir))}",
          file=sys.stderr)
    pid = ownership.holder(member_dir)
    if pid is not None:
        print(f"dledger: store dir {member_dir} is in use by pid {pid}: the end of the log may be changing",
              file=sys.stderr)
    try:
        _dump(entries, args.json)
    except StoreError as exc:
        print(f"dledger: damaged store: {exc}", file=sys.stderr)
        return 1
    return 0


def _dump(entries, as_json: bool) -> None:
    out = sys.stdout
    for e in entries:
        text = _text(e.body)
        if as_json:
            record = {"index": e.index, "term": e.term, "pos": e.pos, "magic": e.magic, "size": e.size,
                      "body_crc": e.body_crc & 0xFFFFFFFF, "body": base64.b64encode(e.body).decode("ascii")}
            if text is not None:
                record["text"] = text
            out.write(json.dumps(record, sort_keys=True) + "\n")
        else:
            shown = repr(text) if text is not None else f"<{len(e.body)} bytes> {e.body[:24].hex()}"
            out.write(f"{e.index:>8} term={e.term} pos={e.pos} magic={e.magic} size={e.size} "
                      f"crc={e.body_crc & 0xFFFFFFFF:08x} {shown}\n")


def lmdb_member_dir(env_dir):
    from dledger.store.lmdbstore import member_dir_of

    return member_dir_of(env_dir)


def cmd_reset_vote(args) -> int:
    """Lock the store, work out the smallest safe term, write ``(N, no vote)`` atomically."""
    kind, path = offline.locate(args.dir, args.type)
    member_dir = lmdb_member_dir(path) if kind == "lmdb" else path
    held = ownership.claim(member_dir)  # StoreInUseError while a member runs: exit 2 with that line
    try:
        if kind == "lmdb":
            return _reset_lmdb(path, member_dir, args.term)
        return _reset_mmap(member_dir, args.term)
    finally:
        ownership.release(held)


def _too_small(term: int, minimum: int, last: int | None, known: tuple[int, ...]) -> int:
    why = [f"last log term {last}" if last is not None and last >= 0 else "an empty log"]
    if last == ownership.UNKNOWN_TERM:
        why = ["log data whose term cannot be read"]
    why += [f"a readable earlier term {t}" for t in known]
    print(f"dledger: error: --term {term} is too small: it must be at least {minimum} ({', '.join(why)}); "
          f"better the group's current term + 1 (see `dledger metadata`)", file=sys.stderr)
    return 2


def _reset_mmap(member_dir, term: int) -> int:
    from dledger.store import termvote

    state, saved, problem, known = termvote.read_state(member_dir)
    known = known + ((saved[0],) if saved is not None else ())
    last = offline.mmap_last_term(member_dir)
    minimum = ownership.minimum_term(last, known)
    if term < minimum:
        return _too_small(term, minimum, last, known)
    termvote.FileTermVoteStore(member_dir).save(term, None)
    was = f"term {saved[0]}, voted for {saved[1] or 'nobody'}" if saved is not None else f"currterm {problem}"
    print(f"{member_dir / termvote.NAME}: term {term}, no vote (was: {was})")
    return 0


def _reset_lmdb(env_dir, member_dir, term: int) -> int:
    from dledger.store.lmdbstore import LmdbTermVoteStore, SharedEnv

    shared = SharedEnv.acquire(env_dir)
    try:
        with shared.env.begin() as txn:
            try:
                saved = shared.read_term_vote(txn)
                was = "no record" if saved is None else f"term {saved[0]}, voted for {saved[1] or 'nobody'}"
            except StoreError as exc:
                saved, was = None, f"damaged: {exc}"
            last = shared.last_term(txn)
        known = (saved[0],) if saved is not None else ()
        minimum = ownership.minimum_term(last, known)
        if term < minimum:
            return _too_small(term, minimum, last, known)
        term_store = LmdbTermVoteStore(env_dir)
        try:
            term_store.save(term, None)
        finally:
            term_store.close()
    finally:
        shared.release()
    print(f"{env_dir}: term/vote record set to term {term}, no vote (was: {was})")
    return 0
