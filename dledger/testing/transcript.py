"""Scenario transcripts (etcd/raft's datadriven ``testdata/*.txt``) over the in-process cluster.

A transcript is a text file of blocks::

    # a comment line explains the scenario (SPEC section, what must hold)
    command arg key=value ...
    ----
    the output the command must print
    <blank line>

:func:`run_transcript` executes each command in order and compares its output with the block's;
with ``rewrite=True`` it writes the actual outputs back (``DLEDGER_REWRITE_TRANSCRIPTS=1 pytest
tests/test_transcripts.py``), so a new transcript is written by hand up to the commands and its
outputs are then *read* and checked by a reviewer, never trusted blindly.

Time is virtual (:class:`~dledger.testing.clock.SimClock`) and every random choice comes from the
group's seed, so a transcript replays exactly.

Group commands (a whole :class:`~dledger.testing.Cluster`):

* ``group n=3 seed=1 [option=value ...]`` -- a new group; options are configuration options or
  :class:`~dledger.testing.Cluster` arguments (``tear_on_crash=false``; ``flush_latency=0`` makes flushes
  durable at once: the transcripts written before flushes took virtual time say so, their elections
  depend on it).
* ``disk n1 terms=1*100,2 [committed=89] [from=0]`` -- preload n1's disk: 100 entries of term 1, one of
  term 2, the first at index ``from`` (``term:prefix`` gives the entries another body prefix, i.e. other
  contents, as a deposed leader's).
* ``vote n1 term=1 [for=n0]`` -- n1's persisted term and vote.
* ``start [ids]``, ``crash id``, ``restart id``, ``pause id``, ``isolate id``, ``heal``,
  ``partition a b | c d`` -- as the Cluster calls of the same names.
* ``block a->b`` / ``unblock a->b`` -- drop (or stop dropping) every message from ``a`` to ``b``.
* ``drop a->b TYPE`` -- drop every ``TYPE`` push (APPEND, COMMIT, COMPARE, TRUNCATE) from ``a`` to ``b``.
* ``hold-flush id`` / ``release-flush id`` -- ``id``'s disk completes no flush until released (a slow
  ``fdatasync``: what it wrote stays in memory only, and a crash loses it).
* ``submit body ...`` -- a client sends the appends to the leader without waiting (one attempt each);
  ``acks`` prints their answers so far.
* ``tick seconds`` -- advance virtual time.
* ``run-until leader=id [timeout=s]`` -- advance until ``id`` leads; prints whether it did.
* ``propose body ...`` -- a client appends the bodies; prints each ack (index or error code).
* ``transfer from->to`` -- ask the leader ``from`` to hand leadership to ``to``; prints the answer.
* ``get id begin [max=10] [follower]`` -- a GET from ``begin`` sent to member ``id`` (``follower``: marked
  ``followerRead``); prints the entries served, as ``log`` does, or the refusal's code.
* ``state`` -- one line per member: role, term, leader, end index, committed index.
* ``log id`` -- member ``id``'s log as runs ``first-last tTERM:what`` (what: ``noop``, a body prefix, a body).

Follower commands (one :class:`~dledger.replication.follower.EntryHandler` over a memory store):

* ``follower id term=1 leader=n0`` -- a new follower with an empty log.
* ``leader-log terms=1*3`` -- the entries the pushes below carry.
* ``push TYPE first[-last] [term= leader= commit=]`` -- a push of the leader's entries; prints the reply.
* ``follow term=2 leader=n2`` -- the follower learns a new leadership (as from a heartbeat).
* ``follower-state`` -- its end and committed index.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from twisted.internet import task
from twisted.internet.defer import maybeDeferred
from twisted.python.failure import Failure

from dledger.codes import EntryType, PushType, ResponseCode
from dledger.errors import DLedgerError
from dledger.messages import GetEntriesRequest, LeadershipTransferRequest, PushEntryRequest
from dledger.testing.cluster import Cluster
from dledger.testing.simdisk import make_entries, preload

REWRITE_ENV = "DLEDGER_REWRITE_TRANSCRIPTS"


@dataclass
class Block:
    """One command of a transcript, the output it expects and the line it starts on."""

    line: int
    comments: list[str]
    command: str
    expected: str


def parse(text: str) -> list[Block]:
    """The blocks of a transcript (comments kept, so a rewrite loses nothing)."""
    blocks, comments, lines = [], [], text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.startswith("#"):
            comments.append(line)
            i += 1
            continue
        start, command = i + 1, line.strip()
        i += 1
        if i >= len(lines) or lines[i].strip() != "----":
            raise ValueError(f"line {start}: {command!r} is not followed by a '----' line")
        i += 1
        out = []
        while i < len(lines) and lines[i].strip():
            out.append(lines[i].rstrip())
            i += 1
        blocks.append(Block(start, comments, command, "\n".join(out)))
        comments = []
    if comments:
        blocks.append(Block(len(lines), comments, "", ""))
    return blocks


def render(blocks: list[Block]) -> str:
    out = []
    for b in blocks:
        out.extend(b.comments)
        if b.command:
            out += [b.command, "----", b.expected, ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _entries(spec: str, start: int = 0) -> list:
    """``1*100,2,3:s5`` -> consecutive entries from index ``start``: 100 of term 1, one of term 2, one of term 3
    with body prefix s5 (other contents than the ``e`` entries of the same index and term)."""
    out: list = []
    for part in spec.split(","):
        term_part, _, prefix = part.partition(":")
        term, _, count = term_part.partition("*")
        pos = out[-1].pos + out[-1].size if out else 0
        out += make_entries([int(term)] * int(count or 1), start_index=start + len(out), start_pos=pos,
                            prefix=(prefix or "e").encode())
    return out


def _value(text: str):
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        return text


def _kv(args: list[str]) -> tuple[list[str], dict]:
    pos, kw = [], {}
    for a in args:
        if "=" in a:
            k, v = a.split("=", 1)
            kw[k] = v
        else:
            pos.append(a)
    return pos, kw


def _describe(entry) -> str:
    if entry.magic == EntryType.NOOP:
        return "noop"
    body = entry.body.decode("utf-8", "replace")
    prefix, _, rest = body.partition("-")
    return prefix if rest.startswith(f"{entry.index}-t") else body


def log_runs(entries) -> str:
    """A log as runs of equal (term, what): ``0-99 t1:e  100 t2:noop``."""
    runs: list[list] = []
    for e in entries:
        token = f"t{e.term}:{_describe(e)}"
        if runs and runs[-1][2] == token and runs[-1][1] == e.index - 1:
            runs[-1][1] = e.index
        else:
            runs.append([e.index, e.index, token])
    if not runs:
        return "(empty)"
    return "  ".join((f"{a}" if a == b else f"{a}-{b}") + f" {t}" for a, b, t in runs)


def _held(store) -> list:
    """Every entry a store holds."""
    if store.ledger_end_index < 0:
        return []
    return [store.get(i) for i in range(store.ledger_begin_index, store.ledger_end_index + 1)]


def _answer(body: str, result, pending: str) -> str:
    """One append's line: its index, its refusal's code, or ``pending`` while it has no answer."""
    if result is None:
        return f"{body}: {pending}"
    if isinstance(result, Failure):
        return f"{body}: {_code(result)}"
    return f"{body}: index {result.index}"


def _code(result) -> str:
    if isinstance(result, Failure):
        err = result.value
        return err.code.name if isinstance(err, DLedgerError) else type(err).__name__
    return ResponseCode(result.code).name


@dataclass
class Runner:
    """The state a transcript's commands act on."""

    cluster: Cluster | None = None
    disks: dict = field(default_factory=dict)
    votes: dict = field(default_factory=dict)
    handler: object = None
    follower_clock: object = None
    leader_entries: list = field(default_factory=list)
    epoch: tuple[int, str] = (1, "n0")
    submitted: list = field(default_factory=list)  # (body, answer or None) of ``submit``

    def run(self, command: str) -> str:
        words = command.split()
        name, args = words[0], words[1:]
        method = getattr(self, "do_" + name.replace("-", "_"), None)
        if method is None:
            raise ValueError(f"unknown transcript command {name!r}")
        return method(args)

    # -- the group ------------------------------------------------------------------------------
    def _group(self) -> Cluster:
        if self.cluster is None:
            raise ValueError("no group: start the transcript with 'group n=... seed=...'")
        return self.cluster

    def do_group(self, args) -> str:
        _, kw = _kv(args)
        n, seed = int(kw.pop("n", 3)), int(kw.pop("seed", 0))
        self.cluster = Cluster(n, seed=seed, **{k: _value(v) for k, v in kw.items()})
        return "ok"

    def do_disk(self, args) -> str:
        (mid,), kw = _kv(args)
        c = self._group()
        preload(c.disks[mid], _entries(kw["terms"], int(kw.get("from", 0))), committed=int(kw.get("committed", -1)))
        return log_runs(c.disks[mid].entries)

    def do_vote(self, args) -> str:
        (mid,), kw = _kv(args)
        self._group().term_stores[mid].save(int(kw["term"]), kw.get("for"))
        return "ok"

    def do_start(self, args) -> str:
        self._group().start(*args)
        return "ok"

    def do_crash(self, args) -> str:
        self._group().crash(args[0])
        return "ok"

    def do_restart(self, args) -> str:
        self._group().restart(args[0])
        return "ok"

    def do_pause(self, args) -> str:
        self._group().pause(args[0])
        return "ok"

    def do_isolate(self, args) -> str:
        self._group().isolate(args[0])
        return "ok"

    def do_heal(self, args) -> str:
        self._group().heal()
        return "ok"

    def do_partition(self, args) -> str:
        groups = [g.split() for g in " ".join(args).split("|")]
        self._group().partition(*groups)
        return "ok"

    def do_block(self, args) -> str:
        src, dst = args[0].split("->")
        self._group().network.block(src, dst)
        return "ok"

    def do_unblock(self, args) -> str:
        src, dst = args[0].split("->")
        self._group().network.unblock(src, dst)
        return "ok"

    def do_drop(self, args) -> str:
        src, dst = args[0].split("->")
        kind = PushType[args[1]]
        self._group().network.drop_matching(
            lambda s, d, req: (s, d) == (src, dst) and isinstance(req, PushEntryRequest) and req.type is kind)
        return "ok"

    def do_hold_flush(self, args) -> str:
        self._group().disks[args[0]].hold()
        return "ok"

    def do_release_flush(self, args) -> str:
        self._group().disks[args[0]].release()
        return "ok"

    def do_submit(self, args) -> str:
        from dledger.client import DLedgerClient
        c = self._group()
        # One attempt each, to the leader: a retry elsewhere would blur the scenario.
        client = DLedgerClient(c.network.transport("submitter"), c.configs[c.ids[0]].group, [c.leader()],
                               clock=c.clock, max_attempts=1)
        for body in args:
            slot = [body, None]
            self.submitted.append(slot)
            client.append(body.encode()).addBoth(lambda r, slot=slot: slot.__setitem__(1, r))
        return "sent"

    def do_acks(self, args) -> str:
        return "\n".join(_answer(body, r, "no answer yet") for body, r in self.submitted) or "(none)"

    def do_tick(self, args) -> str:
        self._group().run(float(args[0]))
        return "ok"

    def do_run_until(self, args) -> str:
        _, kw = _kv(args)
        c = self._group()
        ok = c.run_until(lambda: c.stable_leader() == kw["leader"], float(kw.get("timeout", 30)))
        return f"{kw['leader']} leads" if ok else f"{kw['leader']} does not lead (leader: {c.leader()})"

    def do_propose(self, args) -> str:
        c = self._group()
        client = c.client()
        results: dict[int, object] = {}
        for k, body in enumerate(args):
            client.append(body.encode()).addBoth(lambda r, k=k: results.__setitem__(k, r))
        c.run_until(lambda: len(results) == len(args), 30)
        return "\n".join(_answer(body, results.get(k), "no answer") for k, body in enumerate(args))

    def do_transfer(self, args) -> str:
        c = self._group()
        src, dst = args[0].split("->")
        server = c.servers[src]
        req = LeadershipTransferRequest(group=server.config.group, term=server.state.curr_term, transfer_id=src,
                                        transferee_id=dst)
        got: list = []
        maybeDeferred(server.handle_leadership_transfer, req).addBoth(got.append)
        c.run_until(lambda: bool(got), 30)
        if not got:
            return "no answer"
        return _code(got[0]) + (f" term={got[0].term}" if not isinstance(got[0], Failure) else "")

    def do_get(self, args) -> str:
        (mid, begin, *flags), kw = _kv(args)
        c = self._group()
        server = c.servers[mid]
        req = GetEntriesRequest(group=server.config.group, remote_id=mid, begin_index=int(begin),
                                max_size=int(kw.get("max", 10)), follower_read="follower" in flags or None)
        got: list = []
        maybeDeferred(server.handle_request, req).addBoth(got.append)
        c.run_until(lambda: bool(got), 30)
        if not got:
            return "no answer"
        if isinstance(got[0], Failure):
            return _code(got[0])
        return log_runs(got[0].entries)

    def do_state(self, args) -> str:
        c = self._group()
        lines = []
        for mid in c.ids:
            s = c.servers.get(mid)
            if s is None:
                lines.append(f"{mid} down")
                continue
            st, store = s.state, s.store
            lines.append(f"{mid} {st.role.name} term={st.curr_term} leader={st.leader_id} "
                         f"end={store.ledger_end_index} commit={store.committed_index}")
        return "\n".join(lines)

    def do_log(self, args) -> str:
        c = self._group()
        return log_runs(_held(c.servers[args[0]].store))

    # -- one follower ---------------------------------------------------------------------------
    def do_follower(self, args) -> str:
        from dledger.replication.durability import Flusher
        from dledger.replication.follower import EntryHandler
        from dledger.store.memory import MemoryLogStore
        from dledger.testing.store_contract import FakeMemberState
        (mid,), kw = _kv(args)
        self.epoch = (int(kw.get("term", 1)), kw.get("leader", "n0"))
        state = FakeMemberState(self_id=mid)
        state.follow(*self.epoch)
        store = MemoryLogStore(state)
        self.follower_clock = clock = task.Clock()
        self.handler = EntryHandler(state, store, Flusher(store, clock), clock, push_timeout=1.0)
        return "ok"

    def do_leader_log(self, args) -> str:
        _, kw = _kv(args)
        self.leader_entries = _entries(kw["terms"])
        return log_runs(self.leader_entries)

    def do_follow(self, args) -> str:
        _, kw = _kv(args)
        self.epoch = (int(kw["term"]), kw["leader"])
        self.handler.state.follow(*self.epoch)
        self.handler.reset()
        return "ok"

    def do_push(self, args) -> str:
        (kind, *span), kw = _kv(args)
        type_ = PushType[kind]
        entry, batch = None, []
        if span:
            first, _, last = span[0].partition("-")
            chosen = self.leader_entries[int(first):int(last or first) + 1]
            if type_ is PushType.APPEND:
                batch = chosen
            else:
                entry = chosen[0]
        term, leader = int(kw.get("term", self.epoch[0])), kw.get("leader", self.epoch[1])
        req = PushEntryRequest(group="g0", remote_id=self.handler.state.self_id, local_id=leader, leader_id=leader,
                               term=term, commit_index=int(kw.get("commit", -1)), type=type_, entry=entry,
                               batch_entry=batch)
        got: list = []
        self.handler.handle_push(req).addBoth(got.append)
        self.follower_clock.advance(0)
        if not got:
            return "waiting"
        if isinstance(got[0], Failure):
            return _code(got[0])
        return f"{ResponseCode(got[0].code).name} end={got[0].end_index}"

    def do_follower_state(self, args) -> str:
        store = self.handler.store
        return f"end={store.ledger_end_index} commit={store.committed_index} log: {log_runs(_held(store))}"


def run_transcript(path: Path, rewrite: bool | None = None) -> list[str]:
    """Run the transcript at ``path``; the mismatches as messages (empty: it passed).

    ``rewrite`` (default: the ``DLEDGER_REWRITE_TRANSCRIPTS`` environment variable) writes the actual
    outputs back into the file instead of comparing.
    """
    if rewrite is None:
        rewrite = bool(os.environ.get(REWRITE_ENV))
    blocks = parse(path.read_text())
    runner, problems = Runner(), []
    try:
        for b in blocks:
            if not b.command:
                continue
            actual = runner.run(b.command)
            if actual != b.expected:
                if rewrite:
                    b.expected = actual
                else:
                    problems.append(f"{path.name}:{b.line}: {b.command}\n--- expected\n{b.expected}\n"
                                    f"--- actual\n{actual}")
    finally:
        if runner.cluster is not None:
            runner.cluster.stop()
    if rewrite:
        path.write_text(render(blocks))
    return problems
