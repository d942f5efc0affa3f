"""Who may use a store directory: the exclusive lock, the identity record, and the term/vote rule.

Three mistakes an operator can make with a member's store directory, and
what stops each (issue #9 items 3-5):

* **Two processes on one directory** (systemd plus a manual start, a typo in
  ``--listen``): the second one would recover, i.e. rewrite, the live
  member's files.  A member takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on
  ``<member dir>/lock`` before it reads or writes anything else and writes
  its pid into it; a second process fails with :class:`StoreInUseError`
  (``store dir X is in use by pid N``).  The kernel drops the lock when the
  process dies, so a crash never leaves a stale lock behind.
* **A store of another group or member** (a copied directory, a wrong
  ``--id``): the identity record ``<member dir>/identity.json`` (group,
  member, a random store id, created at) is written when a member first
  starts on the store and checked on every start; a mismatch is a
  :class:`StoreOwnerError` naming the owner and ``--adopt-store``, which
  rewrites the record for a deliberate move.  Java DLedger stores have no
  record and get one on their first start.
* **A lost term/vote record**: a member whose ``currterm`` is gone would
  start at term 0 and could vote a second time in a term it already voted
  in.  :func:`term_vote_decision` refuses to start a store that holds a log,
  or that a member already started on (it has an identity record, which is
  only written after the term record), unless the record is readable; the
  error names ``dledger store reset-vote`` and the smallest safe term.

Locks are per process and counted: a member's term store and log store (and
an in-process restart in tests) share one lock.  Offline readers
(``dledger store verify/dump``) take none; they only ask :func:`holder`
whether a member is running on the directory, since they never write.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

from twisted.logger import Logger

from dledger import diskio
from dledger.errors import StoreError, StoreInUseError, StoreOwnerError, TermVoteLostError

log = Logger()

LOCK_NAME = "lock"
IDENTITY_NAME = "identity.json"


# -- the lock ------------------------------------------------------------------------------------
def _read_pid(fd: int) -> str:
    try:
        raw = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        raw = ""
    return raw if raw.isdigit() else "unknown"


def in_use_message(member_dir: str | Path, pid: str) -> str:
    return f"store dir {member_dir} is in use by pid {pid}"


def lock_dir(member_dir: Path) -> int:
    """Take the exclusive lock on ``member_dir/lock`` (created if needed) and write our pid; the descriptor.

    Non-blocking: another holder is a :class:`StoreInUseError` at once.  The
    file is truncated only once we hold the lock, so a failed attempt never
    touches the holder's pid.
    """
    path = member_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StoreError(f"store dir {member_dir}: cannot open its lock file {path} ({exc.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        pid = _read_pid(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise StoreInUseError(in_use_message(member_dir, pid)) from None
        raise StoreError(f"store dir {member_dir}: cannot lock {path} ({exc.strerror})") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    except OSError:
        pass  # the pid is a courtesy for the error message; the lock is what matters
    return fd


def holder(member_dir: str | Path) -> str | None:
    """The pid (as text) of the process holding ``member_dir``'s lock, None if nobody does.

    For read-only tools: opens the lock file without creating it and probes
    with a shared non-blocking lock that is dropped at once, so it changes
    nothing and never keeps a member from starting.
    """
    try:
        fd = os.open(Path(member_dir) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _read_pid(fd)
    finally:
        os.close(fd)
    return None


# -- identity ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Owner:
    """Who is opening the store: the member's group and id, and whether it may adopt a foreign store."""

    group: str
    member: str
    adopt: bool = False

    @classmethod
    def from_config(cls, config) -> Owner:
        return cls(config.group, config.self_id, bool(getattr(config, "adopt_store", False)))


def read_identity(member_dir: str | Path) -> dict | None:
    """The identity record of ``member_dir``, None if there is none; StoreError if it is unreadable."""
    path = Path(member_dir) / IDENTITY_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise StoreError(f"{path}: not an identity record ({exc}); move it away and start with --adopt-store "
                         f"to write a new one") from None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("group", "member")):
        raise StoreError(f"{path}: not an identity record (needs 'group' and 'member'); move it away and start "
                         f"with --adopt-store to write a new one")
    return record


def describe_identity(record: dict | None) -> str:
    """One line for tools and logs."""
    if record is None:
        return "none (a Java DLedger or older store; a member writes one on its first start)"
    parts = [f"group {record.get('group')}", f"member {record.get('member')}",
             f"store id {record.get('storeId', '?')}", f"created {record.get('createdAt', '?')}"]
    if record.get("adoptedAt"):
        parts.append(f"adopted {record['adoptedAt']} from {record.get('adoptedFrom', '?')}")
    return ", ".join(parts)


def new_identity(owner: Owner, now: datetime | None = None) -> dict:
    return {"group": owner.group, "member": owner.member, "storeId": uuid.uuid4().hex,
            "createdAt": (now or datetime.now(UTC)).isoformat(timespec="seconds")}


def write_identity(member_dir: str | Path, record: dict) -> None:
    """Blocking, small: replace the identity record atomically (temp file, fsync, rename, directory fsync)."""
    diskio.write_atomic(Path(member_dir) / IDENTITY_NAME,
                        (json.dumps(record, sort_keys=True, indent=1) + "\n").encode("utf-8"))


def identity_mismatch(record: dict | None, owner: Owner) -> str | None:
    """Why ``owner`` may not use a store whose identity is ``record`` (None: it may). Pure."""
    if record is None or (record.get("group"), record.get("member")) == (owner.group, owner.member):
        return None
    return (f"belongs to member {record.get('member')} of group {record.get('group')}, not member "
            f"{owner.member} of group {owner.group}")


# -- claims ----------------------------------------------------------------------------------------
class Claim:
    """This process's hold on one member directory: the lock (shared by every store of the member).

    ``identity`` is the record as found when the directory was first claimed
    with an owner; ``had_identity`` says whether there was one.
    """

    def __init__(self, member_dir: Path, fd: int):
        self.member_dir = member_dir
        self.fd = fd
        self.refs = 0
        self.checked_for: Owner | None = None
        self.identity: dict | None = None
        self.had_identity = False

    def check_owner(self, owner: Owner) -> None:
        """Refuse a store of another group or member unless ``owner.adopt``; remember what was found."""
        if self.checked_for == owner:
            return
        record = read_identity(self.member_dir)
        problem = identity_mismatch(record, owner)
        if problem is not None and not owner.adopt:
            raise StoreOwnerError(f"store dir {self.member_dir} {problem}: refusing to start (check --id, "
                                  f"--group and storeBaseDir; to move this store here deliberately, start once "
                                  f"with --adopt-store)")
        self.identity, self.had_identity = record, record is not None
        self.checked_for = owner

    def record_identity(self, owner: Owner) -> None:
        """Write the identity record if it is missing or (adopting) names another owner."""
        record = self.identity
        if record is not None and identity_mismatch(record, owner) is None:
            return
        if record is None:
            record = new_identity(owner)
            log.info("store dir {dir}: recorded its identity ({identity})", dir=str(self.member_dir),
                     identity=describe_identity(record))
        else:
            previous = f"member {record.get('member')} of group {record.get('group')}"
            record = dict(record, group=owner.group, member=owner.member, adoptedFrom=previous,
                          adoptedAt=datetime.now(UTC).isoformat(timespec="seconds"))
            log.warn("store dir {dir}: adopted (--adopt-store) from {previous} by member {member} of group "
                     "{group}", dir=str(self.member_dir), previous=previous, member=owner.member, group=owner.group)
        write_identity(self.member_dir, record)
        self.identity = record


_claims: dict[str, Claim] = {}


def claim(member_dir: str | Path, owner: Owner | None = None) -> Claim:
    """Lock ``member_dir`` for this process (counted) and, with an ``owner``, check the identity record.

    Call before anything else touches the directory; pair with :func:`release`.
    """
    member_dir = Path(member_dir)
    try:
        member_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise StoreError(f"store dir {member_dir} exists but is not a directory") from None
    except OSError as exc:
        raise StoreError(f"store dir {member_dir}: cannot create it ({exc.strerror})") from None
    if not member_dir.is_dir():
        raise StoreError(f"store dir {member_dir} exists but is not a directory")
    key = str(member_dir.resolve())
    c = _claims.get(key)
    if c is None:
        c = _claims[key] = Claim(member_dir, lock_dir(member_dir))
    c.refs += 1
    if owner is not None:
        try:
            c.check_owner(owner)
        except BaseException:
            release(c)
            raise
    return c


def release(c: Claim | None) -> None:
    """Drop one hold; the lock goes with the last (the lock file stays, holding the last pid)."""
    if c is None or c.refs <= 0:
        return
    c.refs -= 1
    if c.refs == 0:
        _claims.pop(str(c.member_dir.resolve()), None)
        os.close(c.fd)


# -- the term/vote rule ---------------------------------------------------------------------------
class TermVote(Enum):
    """What a store found of its term/vote record."""

    OK = "ok"
    MISSING = "missing"
    DAMAGED = "damaged"


class Decision(Enum):
    USE = "use"  # the record is fine
    FRESH = "fresh"  # a new store: start at term 0, and write the record now
    REFUSE = "refuse"


#: ``last_term`` when the log holds data whose term could not be read.
UNKNOWN_TERM = -2


def term_vote_decision(state: TermVote, log_last_term: int | None, had_identity: bool) -> Decision:
    """Start, start fresh at term 0, or refuse (pure; table-tested).

    ``log_last_term`` is None for an empty log.  A missing record is only
    believable for a store nobody ran yet: no log and no identity record
    (a member writes its term record before its identity record).
    """
    if state is TermVote.OK:
        return Decision.USE
    if state is TermVote.DAMAGED or log_last_term is not None or had_identity:
        return Decision.REFUSE
    return Decision.FRESH


def minimum_term(log_last_term: int | None, known_terms: tuple[int, ...] = ()) -> int:
    """The smallest term ``reset-vote`` may set: past the last log term and any term still readable."""
    floor = max([-1, *(t for t in known_terms if t is not None)])
    last = -1 if log_last_term is None or log_last_term == UNKNOWN_TERM else log_last_term
    return max(last, floor) + 1


def lost_message(where: str, problem: str, store_dir: str | Path, log_last_term: int | None,
                 known_terms: tuple[int, ...] = (), *, outcome: str = "refusing to start") -> str:
    """The one line of a refused start: what is wrong and the exact command that repairs it."""
    n = minimum_term(log_last_term, known_terms)
    if log_last_term is None:
        held = "this member has started on this store before"
    elif log_last_term == UNKNOWN_TERM:
        held = "the log holds data"
    else:
        held = f"the log holds entries up to term {log_last_term}"
    return (f"{where} {problem} but {held}: starting would forget a vote (this member could vote twice in a term); "
            f"{outcome}. Recover with: dledger store reset-vote {store_dir} --term {n} "
            f"(or the group's current term + 1 if that is higher; see `dledger metadata`)")


def settle_term_vote(state: TermVote, saved: tuple[int, str | None] | None, problem: str,
                     log_last_term: int | None, *, had_identity: bool, where: str, store_dir: str | Path,
                     save, claim: Claim | None, owner: Owner | None,
                     known_terms: tuple[int, ...] = ()) -> tuple[int, str | None]:
    """What a term store's ``load`` returns, once it has read its record: the :func:`term_vote_decision` applied.

    USE: ``saved``; FRESH: term 0 saved (``save(0, None)``); REFUSE: the
    :func:`refuse` error.  The identity record is written once the term
    record is settled (a member writes its term record before its identity).
    """
    decision = term_vote_decision(state, log_last_term, had_identity)
    if decision is Decision.REFUSE:
        raise refuse(where, problem, store_dir, log_last_term, known_terms)
    if decision is Decision.FRESH:
        save(0, None)
        saved = (0, None)
    if owner is not None:
        claim.record_identity(owner)
    return saved


def refuse(where: str, problem: str, store_dir: str | Path, log_last_term: int | None,
           known_terms: tuple[int, ...] = ()) -> TermVoteLostError:
    return TermVoteLostError(lost_message(where, problem, store_dir, log_last_term, known_terms))
