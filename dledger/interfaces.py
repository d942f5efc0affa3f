"""Every seam of dledger, as zope.interface interfaces, in one module.

The core is written against these and nothing else: a server takes a log
store, a term/vote store and a transport as constructor arguments, and
applications hook in through role-change handlers, append hooks and commit
listeners.  Implementations declare ``@implementer(...)`` and are checked
with ``zope.interface.verify.verifyObject`` in the tests.

Optional capabilities are small extra interfaces checked at run time with
``IFoo.providedBy(obj)``, not flags on a fat interface.
"""

from __future__ import annotations

from zope.interface import Attribute, Interface


class IMemberState(Interface):
    """The read-only view of a member's election state that a log store needs.

    A follower's store refuses entries unless they come from the leader it
    knows, in the term it is in (SPEC §4 ``appendAsFollower``).
    """

    self_id = Attribute("This member's id.")
    role = Attribute("The current :class:`dledger.codes.Role`.")
    curr_term = Attribute("The current term (int).")
    leader_id = Attribute("The leader this member follows in ``curr_term``, or None.")


class ILogStore(Interface):
    """The replicated log on one member (SPEC §5).

    Indexes are contiguous from ``ledger_begin_index`` to
    ``ledger_end_index`` (both -1 when empty).  Appends and reads are
    synchronous; durability is asked for separately with :meth:`flush`, so
    that many appends share one fsync (group commit).  Errors that a peer or
    client must see are :class:`dledger.errors.DLedgerError` with a code.
    """

    ledger_begin_index = Attribute("Index of the first entry kept, -1 when empty.")
    ledger_end_index = Attribute("Index of the last entry, -1 when empty.")
    ledger_end_term = Attribute("Term of the last entry, -1 when empty.")
    committed_index = Attribute("Highest index known committed; never past ledger_end_index.")
    flushed_index = Attribute("Highest index known durable (what a crash cannot take away).")
    flush_rounds = Attribute(
        "How many :meth:`flush` calls may usefully run at once (an int >= 1): 1 for a store whose rounds run one "
        "after another, 2 for one that starts a round beside the running one (the mmap store's pipelined group "
        "commit). The member's :class:`dledger.replication.durability.Flusher` keeps that many flushes in flight.")

    def startup() -> None:
        """Open and recover the log. Raises :class:`dledger.errors.StoreError` if it cannot."""

    def shutdown():
        """Flush and close; returns a Deferred that fires when everything is on disk."""

    def append_as_leader(entry):
        """Append ``entry`` (its ``term`` and ``body`` set) at ``ledger_end_index + 1``.

        Assigns ``index`` and ``pos`` (the store's layout), seals the body
        CRC and returns the stored entry.  Raises DLedgerError (DISK_FULL,
        DISK_ERROR, UNEXPECTED_ARGUMENT for an entry too large) when it
        cannot.  Whether this member may append (it leads) is checked by the
        core before the call (:class:`dledger.store.guard.LogGuard`), and the
        append hooks are the core's too (see :class:`IPlainLogStore`).
        """

    def append_as_follower(entry, leader_term: int, leader_id: str):
        """Append an entry received from the leader, exactly as the leader stored it.

        The core has already checked that this member is a follower
        (NOT_FOLLOWER), that ``leader_term`` is the current term
        (INCONSISTENT_TERM) and that ``leader_id`` is the known leader
        (INCONSISTENT_LEADER).  The store checks that the index is
        ``ledger_end_index + 1`` (INCONSISTENT_INDEX) and that the byte
        position agrees with the leader's (DISK_ERROR).  Returns the stored entry.
        """

    def truncate(entry, leader_term: int, leader_id: str) -> int:
        """Make ``entry`` the last entry of the log and return its index.

        Everything after ``entry.index`` is dropped; if the entry stored at
        that index differs it is replaced.  If ``entry.index`` lies outside
        ``[begin, end + 1]`` the log is reset to hold only ``entry`` (a
        follower behind the leader's begin index).  The core checks role,
        term and leader first, as for :meth:`append_as_follower`.  Never
        drops a committed entry unless the log is reset.
        """

    def get(index: int):
        """The entry at ``index``.

        DLedgerError(INDEX_LESS_THAN_LOCAL_BEGIN) below the begin index,
        DLedgerError(INDEX_OUT_OF_RANGE) past the end.
        """

    def get_range(begin_index: int, max_count: int, max_bytes: int) -> list:
        """Up to ``max_count`` entries from ``begin_index``, stopping before ``max_bytes`` (but at least one)."""

    def update_committed_index(term: int, index: int) -> None:
        """Advance the committed index; ignored if it would move back, clamped to the end."""

    def get_first_log_of_target_term(term: int, end_index: int) -> int:
        """Smallest index ``<= end_index`` whose entry has ``term``, or -1."""

    def flush():
        """Make every appended entry durable. Returns a Deferred firing with :attr:`flushed_index`."""


class IPlainLogStore(ILogStore):
    """A log store that is storage only: the core checks roles and runs the append hooks (hashicorp/raft's LogStore).

    Such a store checks nothing about roles, terms or leaders and keeps no
    append hooks; :class:`dledger.store.guard.LogGuard` does both, once, for
    every store.  Hooks must see an entry's final position, which the store
    decides, so its leader appends take a ``seal`` function: once the store
    has placed ``entry`` at ``index``/``pos`` it stores ``seal(entry, index,
    pos)`` (the entry rewritten by the hooks, CRC sealed) instead of sealing
    the CRC itself (:func:`dledger.store.base.placed`).  ``seal`` may raise a
    DLedgerError (:class:`dledger.errors.AppendHookError`), which fails that
    entry like any other refusal.  ``seal`` is None while no hook is
    registered.  A store that also provides :class:`IBatchLogStore` takes
    ``seal`` as the second argument of ``append_batch_as_leader(entries,
    seal=None)`` too.

    A store that does not provide this interface (written before the split)
    still works: it checks roles itself (the core checks first anyway) and
    the core registers the hooks with its ``add_append_hook(hook)``.
    """

    def append_as_leader(entry, seal=None):
        """:meth:`ILogStore.append_as_leader`, storing ``seal(entry, index, pos)`` when ``seal`` is given."""


class IBatchLogStore(ILogStore):
    """A store that appends many entries in one call (one write per run of entries instead of one each).

    Each entry gets exactly the checks, ``seal`` (see :class:`IPlainLogStore`)
    and placement the one-entry methods give it, in order.  If entry ``k`` fails, entries ``0..k-1`` stay
    appended (as if appended one by one) and a
    :class:`dledger.errors.BatchAppendError` is raised: its ``code`` is the
    failing entry's error and its ``stored`` lists the entries that stayed.
    The core (:class:`dledger.store.guard.LogGuard`) uses these when the
    store provides them and falls back to the one-entry methods otherwise.
    """

    def append_batch_as_leader(entries) -> list:
        """:meth:`ILogStore.append_as_leader` for each of ``entries`` in order; returns the stored entries."""

    def append_batch_as_follower(entries, leader_term: int, leader_id: str) -> list:
        """:meth:`ILogStore.append_as_follower` for each of ``entries`` in order; returns the stored entries."""


class IRetainingLogStore(ILogStore):
    """A store that deletes old entries by itself (retention); ``ledger_begin_index`` may move forward."""

    def clean_expired(now: float) -> int:
        """Delete whole files past retention (never above the committed index); returns entries removed."""


class ITermVoteStore(Interface):
    """Durable ``currTerm`` and ``currVoteFor``, kept apart from the log (as hashicorp/raft does).

    :meth:`save` must be durable (fsync) when it returns: a member answers a
    vote only after its promise is on disk.

    Optional attribute ``save_off_reactor`` (default False): True says
    :meth:`save` may run on a thread-pool thread (while the reactor keeps
    running), so a running member writes term and vote off the reactor
    thread.  The member never runs two saves at once.
    """

    def load() -> tuple:
        """``(term, vote_for)``; ``(0, None)`` for a member that never voted."""

    def save(term: int, vote_for) -> None:
        """Persist atomically and durably before returning."""

    def close() -> None:
        """Release files/handles."""


class IRequestHandler(Interface):
    """Whoever answers requests arriving on a transport (a member's server)."""

    def handle_request(request):
        """Answer ``request`` (a :mod:`dledger.messages` request). Returns a Deferred of the response."""


class IBatchRequestHandler(IRequestHandler):
    """A handler that answers the requests of one read together (the leader appends their bodies in one batch)."""

    def handle_requests(requests: list) -> list:
        """Answer ``requests`` (arrived together, in this order).

        Returns one result per request, in order: what :meth:`handle_request`
        would return for it, or a ``Failure`` where it would raise.
        """


class _AnswerLater:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ANSWER_LATER"


#: What :meth:`IAnsweringRequestHandler.handle_requests_answering` gives in place of a request it answers
#: later through its ``answer`` callable.
ANSWER_LATER = _AnswerLater()


class IAnsweringRequestHandler(IBatchRequestHandler):
    """A batch handler that answers a request waiting for its commit by one plain call, without a Deferred.

    The leader's client APPENDs each waited on a Deferred and its callback chain
    until they committed; a connection serving thousands of one-entry APPENDs a
    second paid that per request (issue #28 target 2).  A connection that sees
    this interface hands its reply writer instead (optional; the DLedgerServer).
    """

    def handle_requests_answering(requests: list, answer, tokens: list) -> list:
        """As :meth:`handle_requests`, except for the requests that wait (client APPENDs on the leader).

        Such a request gets :data:`ANSWER_LATER` in its place, and once it is
        answered -- committed, timed out or its leadership ended: whatever its
        Deferred would have fired with -- ``answer(tokens[i], response)`` is
        called once, on the reactor thread.
        """


class IBatchAppender(Interface):
    """A member that appends several client requests as ONE store batch (optional; the DLedgerServer).

    For an embedding layer that gathers requests itself (the RocketMQ
    broker's single sends arriving in one read): one store write, one
    replicator notification, but each request keeps its own answer.
    """

    def handle_appends(requests) -> list:
        """Append ``requests`` (AppendEntryRequests, in this order) as one store batch.

        Returns one result per request, in order: a Deferred firing with its
        AppendEntryResponse when its last entry commits, or a ``Failure`` (a
        refused request fails alone; never raises).
        """


class ILeaderAware(Interface):
    """A request handler that knows which member leads now (optional).

    The remoting connection's id check asks it: a LEADERSHIP_TRANSFER from a member is accepted only from
    the leader this member follows, speaking for itself (docs/security.md).
    """

    def current_leader():
        """The id of the leader this member follows (itself when it leads), or None."""


class IPluginRequests(Interface):
    """A request handler that serves plugins' request codes (optional; ``dledger_request_handlers``).

    The remoting connection asks it which role a plugin request code needs before it decodes the
    request, as it looks up a core code's permission (docs/security.md).
    """

    def plugin_role(code: int):
        """The role (``read``, ``write``, ``admin``, ``member``) a plugin's handler of ``code`` needs; None if none."""


class ITransport(Interface):
    """Moves requests between members and from clients.

    ``send`` never calls the peer synchronously: the reply always arrives
    through the reactor, on a real network or an in-process one.
    """

    def start(handler) -> object:
        """Begin serving requests to an :class:`IRequestHandler`; returns a Deferred."""

    def stop() -> object:
        """Stop serving and fail outstanding requests; returns a Deferred."""

    def send(peer_id: str, request, timeout: float | None = None):
        """Send ``request`` to member ``peer_id``; Deferred of its response.

        Fails with DLedgerError(NETWORK_ERROR) if the peer cannot be reached
        and DLedgerError(TIMEOUT) after ``timeout`` seconds.
        """


class IRoleChangeHandler(Interface):
    """Told about every role change of its member, in order."""

    def role_changed(term: int, role) -> object:
        """Called with the new term and :class:`dledger.codes.Role`.

        May return a Deferred; the next change is delivered only when it
        fires, so handlers see transitions one at a time and in order.
        """


class IAppendHook(Interface):
    """Runs inside a leader append, before the CRC is computed and the bytes are stored.

    Registered with the member (``dledger_append_hooks`` or
    ``DLedgerServer.add_append_hook``), not with its store: the core runs
    hooks for every store (:mod:`dledger.store.guard`).
    """

    def before_append(entry, buffer, body_offset: int) -> None:
        """``buffer`` is a writable memoryview of exactly the encoded entry (header with index and pos filled in).

        The header comes first and the body runs from ``body_offset``
        (``HEADER_SIZE``) to the end of ``buffer``.  On the mmap store it is a
        view into the store's own write buffer, so the bytes a hook rewrites
        are the bytes written, with no copy.  The hook may rewrite body bytes in
        place (``struct.pack_into``, indexing, same-length slice assignment: the
        RocketMQ layer stores ``entry.pos + BODY_OFFSET`` in the message); a
        memoryview cannot change its length, and an attempt to fails the entry.
        Keeping a reference to ``buffer`` after the call is harmless but
        pointless (later entries are written next to it).
        """


class ICommitListener(Interface):
    """Receives committed application entries, in log order.

    On start the server replays committed entries from :meth:`start_index`,
    so a listener that persists its progress resumes where it stopped and one
    that keeps state in memory rebuilds it.
    """

    def start_index() -> int:
        """Index of the first entry this listener wants (0 for everything still kept)."""

    def entries_committed(entries: list) -> object:
        """Called with consecutive committed entries (NOOPs excluded).

        May return a Deferred to slow delivery down; the next batch waits for it.
        """


class ILeaderReadyListener(Interface):
    """Told when its member leads and its term's first entry is committed (:mod:`dledger.leader_ready`)."""

    def leader_ready(term: int) -> object:
        """Called once per leadership that becomes leader-ready, after the LEADER role change was delivered.

        A member that steps down and leads the same term again (no restart) is told again, with that term.

        May return a Deferred; later listeners and events wait for it.  The
        member may lose leadership at any time after; role-change handlers
        are told as usual.
        """


class IPositionReader(Interface):
    """Optional store capability: raw bytes of the data log by byte position, committed bytes only.

    Positions are those of :attr:`dledger.entry.Entry.pos` (the same on
    every member): an entry's encoded bytes lie at ``[pos, pos + size)``,
    and the tail of a data file an entry did not fit in holds a blank marker
    then zeros, as DLedger's data files do.  A reader never returns bytes
    past :meth:`committed_position`, so what it returns never changes.
    Check with ``IPositionReader.providedBy(store)``.
    """

    def begin_position() -> int:
        """Position of the first byte still kept (the first entry's ``pos``; where the log will start if empty)."""

    def committed_position() -> int:
        """Position just past the last committed entry (:meth:`begin_position` when nothing is committed)."""

    def read_at(pos: int, size: int) -> bytes:
        """``size`` bytes of the data log from ``pos``.

        DLedgerError(INDEX_OUT_OF_RANGE) if the range ends past
        :meth:`committed_position`, INDEX_LESS_THAN_LOCAL_BEGIN if it starts
        before :meth:`begin_position`, UNEXPECTED_ARGUMENT for a negative
        position or size.
        """


class IDiskHealth(Interface):
    """Optional store capability: whether it refuses writes for a disk problem, and the refusal it would give.

    A follower asks before it keeps a push waiting for its turn, and a member reports it in its
    metadata (``dledger metadata`` shows ``disk full``).  Check with ``IDiskHealth.providedBy(store)``.
    """

    disk_problem = Attribute("'disk full' or 'disk error' while appends are refused for that reason, else None")

    def write_refusal():
        """The DLedgerError (DISK_FULL / DISK_ERROR) an append would get now without touching the disk, or None."""


class IRepairableLogStore(Interface):
    """Optional store capability: its data files can be scrubbed, and a damaged committed entry rewritten.

    :class:`dledger.store.scrub.Scrubber` walks the committed entries (``scrub_span``, read and checked off
    the reactor thread), confirms a suspect with ``check_entry`` and has :mod:`dledger.replication.repair`
    fetch a verified copy from another member for ``repair_entry``.  Check with
    ``IRepairableLogStore.providedBy(store)``.
    """

    def scrub_span(index: int, max_bytes: int):
        """A :class:`dledger.store.scrub.Span` of committed entries from ``index`` in one data file, or None."""

    def check_entry(index: int):
        """Entry ``index`` as the data files hold it (no in-memory copy), or DLedgerError(DISK_ERROR)."""

    def index_record(index: int):
        """Index record ``index`` as stored, ``(magic, pos, size, index, term)``, or None if it is not valid."""

    def damaged_header(index: int):
        """The header of entry ``index`` as stored, if it agrees with its index record (body unchecked), else None."""

    def repair_entry(entry):
        """Rewrite committed entry ``entry.index`` with the verified copy ``entry``; a Deferred firing when durable."""


class ICompactingLogStore(ILogStore):
    """Optional store capability: the log forgets what a snapshot holds (docs/snapshots.md).

    Check with ``ICompactingLogStore.providedBy(store)``.  Compaction and
    retention share one rule for what may go (:func:`dledger.store.retention.file_may_go`
    for file stores): never an entry above the committed index, never the last entry.
    """

    snapshot_base = Attribute("``(index, term)`` of the last reset_to_snapshot, ``(-1, -1)`` if none.")

    def compact(below_index: int) -> int:
        """Delete what lies wholly below ``below_index`` (whole files for file stores); returns the new begin index.

        Never deletes above the committed index nor the last entry; the new
        begin index survives a restart (mmap: checkpoint and begin index
        updated atomically, Java DLedger's layout kept).
        """

    def reset_to_snapshot(index: int, term: int, next_pos: int) -> None:
        """Drop every entry: the log is empty *with a base* and survives a restart so.

        Then ``ledger_begin_index = index + 1``, ``ledger_end_index = index``,
        ``ledger_end_term = term``, ``committed_index = index``, and the next
        append is entry ``index + 1`` at byte position ``next_pos``.
        """


class ISnapshotWriter(Interface):
    """Where a state machine writes its section of a snapshot (:meth:`IStateMachine.snapshot`).

    The snapshot store cuts the stream into chunk files with a CRC each; the
    bytes are the machine's own format (the store never parses them).
    """

    def write(data: bytes) -> object:
        """Append ``data`` to the section; returns a Deferred that fires when the writer can take more.

        Flow control: a machine writing a large state waits for each Deferred
        so that no more than a few chunks are ever held in memory.
        """


class ISnapshotReader(Interface):
    """Reads a state machine's section back (:meth:`IStateMachine.restore`)."""

    def read(max_bytes: int) -> object:
        """A Deferred of the next at most ``max_bytes`` bytes of the section; ``b""`` at its end."""


class IStateMachine(Interface):
    """A replicated state machine: fed committed entries in log order, snapshotted, restored.

    Registered with the ``dledger_state_machines`` hook (or
    ``server.add_state_machine``).  Several may run on one member; each owns
    one section of every snapshot, under its :attr:`name`.  A machine keeps
    its state in memory (or in files it rebuilds from a snapshot): the member
    restores the newest snapshot and then applies only the entries after its
    index, so each index is applied exactly once per incarnation of the state.
    """

    name = Attribute("Unique name of the machine and of its snapshot section: ``[a-z0-9_.-]{1,64}``.")

    def apply(entries: list) -> object:
        """Apply consecutive committed entries (NOOPs excluded), in log order.

        May return a Deferred; the member waits for it before the next batch
        and before it takes a snapshot.
        """

    def snapshot(writer) -> object:
        """Write the state as of the last entry applied (an :class:`ISnapshotWriter`); returns a Deferred.

        Called between two ``apply`` calls: the machine captures a
        point-in-time view *synchronously, inside this call* (a frozen copy or
        copy-on-write) and may then write it out while later ``apply`` calls
        change the live state.
        """

    def restore(reader) -> object:
        """Replace the whole state with the one in the section (an :class:`ISnapshotReader`); returns a Deferred."""


class IMembership(Interface):
    """The group's configuration as one member sees it (``server.membership``; issue #23).

    The configuration lives in the log (entries of magic ``CONFIG_CHANGE``): the one in force is the
    newest in this member's log, committed or not, else the snapshot's, else the bootstrap ``--peers``
    (:func:`dledger.membership.rules.in_force`).  Plugins (the RocketMQ broker) observe it to follow
    members joining and leaving.
    """

    configuration = Attribute("The :class:`dledger.membership.configuration.Configuration` in force.")

    def committed() -> bool:
        """The configuration in force is committed (no change in flight)."""

    def observe(callback) -> None:
        """Call ``callback(old, new)`` after every change of the configuration in force.

        Changes come from an appended configuration entry, a truncation that removed one, or a snapshot
        installed; the callback runs on the reactor thread and must not block.
        """

    def propose(change) -> object:
        """On the leader: a Deferred of the new configuration once the change (a
        :class:`dledger.membership.rules.Change`) is committed.

        Fails with a :class:`dledger.errors.DLedgerError` whose message is the one-line refusal
        (:func:`dledger.membership.rules.refusal`) when the change cannot be proposed now; NOT_LEADER on
        a follower.
        """


class IStatusSectionProvider(Interface):
    """One section (or several) of a member's status page, from a plugin (``dledger_status_sections``).

    The status page's seam: the core renders any provider's sections like its own, so a plugin
    (the broker's topics and queues) shows up on ``/status`` without touching the page.  A plain
    function with this signature provides it.
    """

    def __call__() -> object:
        """Return a section (:func:`dledger.status.model.section`), a list of them, or None for none now.

        Called on the reactor thread each time the page polls (about once a second per open page):
        cheap and read-only.  An exception is shown as the section being unavailable, never fails the
        page (:func:`dledger.status.model.plugin_sections`).
        """


class INemesisWorkload(Interface):
    """What the nemesis drives while it injects faults (``dledger.testing.nemesis``: log, kv, broker).

    The runner starts it once the group has a leader, runs the fault schedule, stops it after the
    quiet period, and asks it for the verdict's counts once the members converged; the fault
    schedule and the checks are pure functions (``nemesis.faults``, ``nemesis.tally``, the checkers).
    """

    spans = Attribute("``[(invoked, completed or None, outcome)]`` of every operation, for the summary table.")

    def start() -> object:
        """Start the clients (a coroutine); operations go on until :meth:`stop`."""

    def stop() -> object:
        """Stop issuing operations and wait for those in flight (a coroutine)."""

    def finish(result) -> object:
        """Fill ``result`` (a ``RunResult``) with the counts and leave the history for the checker (a coroutine)."""
