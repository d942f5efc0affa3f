"""``/status.json``: one member's view of its group as a JSON document (read on the reactor thread).

The document (``docs/operations.md`` "The status page" lists the fields)::

    {"group", "self_id", "now", "running",
     "member":  {role, term, leader, begin, end, end_term, committed, applied, pending, store_bytes,
                 disk_used_ratio, disk_problem, store_damaged, scrub},
     "members": [{id, address, self, role, membership, lag, last_contact_s, in_contact, disk_problem}],
     "configuration": {index, committed}              (the configuration in force; issue #23)
     "events":  [{at, term, role, leader, reason}]     (newest first),
     "series":  {t, commits_per_s, appends_per_s, latency_mean_ms, latency_p50_ms, latency_p99_ms},
     "sections": [section, ...]}                      (from plugins: ``dledger_status_sections``)

A *section* is plain data so that the page renders any plugin's alike::

    {"id", "title", "summary": [[label, value], ...],
     "tables": [{"id", "title", "columns": [...], "rows": [[...], ...]}]}

``members`` lists the configuration in force (``membership``: voter, or learner -- "learner, to be
promoted" while the leader waits for it to catch up), not the bootstrap ``--peers``.
A member knows its own state exactly; the leader also knows each follower's lag and last contact.
A follower's page shows the leader it follows; the other members' roles read ``?`` there.
What the page decides (roles it can vouch for, labels, the applied index) is :mod:`dledger.status.rules`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dledger.stats import lag_entries
from dledger.status import rules
from dledger.status.rules import member_role  # noqa: F401 (re-exported: its old home)


def section(id_: str, title: str, *, summary: Iterable[tuple[str, Any]] = (),
            tables: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """A status section (see the module docstring); what ``dledger_status_sections`` providers return."""
    return {"id": id_, "title": title, "summary": [[str(k), v] for k, v in summary], "tables": list(tables)}


def table(id_: str, title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> dict[str, Any]:
    """A table of a section: the page shows 25 rows a page, with a filter box once it has more."""
    return {"id": id_, "title": title, "columns": list(columns), "rows": [list(r) for r in rows]}


def applied_index(server: Any) -> int:
    """The highest index every commit listener has been given (:func:`dledger.status.rules.applied_index`)."""
    return rules.applied_index(server.store.committed_index, server.commit_feed.next_indexes())


def configuration_members(server: Any) -> tuple[list[tuple[str, str, str]], int]:
    """``([(id, address, membership)], entry index)`` of the configuration in force on ``server``.

    ``membership`` is ``voter``, ``learner`` or ``learner, to be promoted``; a server without membership
    tracking (``server.membership``) runs on its ``--peers``, every one a voter, index 0.
    """
    config = getattr(getattr(server, "membership", None), "configuration", None)
    if config is None:
        return [(mid, peer.address, "voter") for mid, peer in server.config.members.items()], 0
    return [(m.id, m.address, rules.membership_label(m.role.value, voter=m.voter, promote=m.promote))
            for m in config.members], config.index


def member_status(server: Any, *, now: float, disk_used_ratio: float | None = None) -> dict[str, Any]:
    """The ``member`` and ``members`` parts of the document for ``server``."""
    cfg, state, store = server.config, server.state, server.store
    role = state.role.name
    damaged = getattr(server, "damaged", None)
    scrubber = getattr(getattr(server, "mending", None), "scrubber", None)
    scrub = None
    if scrubber is not None:
        s = scrubber.stats
        scrub = {"passes": s.passes, "entries": s.entries, "damaged": s.damaged, "repaired": s.repaired}
    from dledger.metrics import store_bytes

    me = {"role": role, "term": state.curr_term, "leader": state.leader_id,
          "begin": store.ledger_begin_index, "end": store.ledger_end_index, "end_term": store.ledger_end_term,
          "committed": store.committed_index, "applied": applied_index(server), "pending": len(server.pending),
          "store_type": cfg.store_type, "store_bytes": store_bytes(store), "disk_used_ratio": disk_used_ratio,
          "disk_problem": getattr(store, "disk_problem", None),
          "store_damaged": None if damaged is None else f"index {damaged[0]}: {damaged[1]}", "scrub": scrub}
    dispatchers = getattr(server.replicator, "dispatchers", {}) if role == "LEADER" and server.replicator else {}
    in_contact = {p: bool(d.in_contact) for p, d in dispatchers.items()}
    members = []
    rows, config_index = configuration_members(server)
    for mid, address, membership in rows:
        row = {"id": mid, "address": address, "self": mid == cfg.self_id,
               "role": rules.member_role(mid, self_id=cfg.self_id, role=role, leader=state.leader_id,
                                   in_contact=in_contact),
               "membership": membership, "lag": None, "last_contact_s": None, "in_contact": None, "disk_problem": None}
        d = dispatchers.get(mid)
        if d is not None:
            row["lag"] = lag_entries(store.ledger_begin_index, store.ledger_end_index, d.known_index())
            last = getattr(d, "last_contact", None)
            row["last_contact_s"] = rules.seconds_since(now, last)
            row["in_contact"] = bool(d.in_contact)
            row["disk_problem"] = d.disk_problem
        elif mid == cfg.self_id:
            row["lag"] = 0 if role == "LEADER" else None
            row["disk_problem"] = me["disk_problem"]
        members.append(row)
    configuration = {"index": config_index,
                     "committed": rules.configuration_committed(config_index, store.committed_index)}
    return {"member": me, "members": members, "configuration": configuration}


def plugin_sections(providers: Iterable[Callable[[], Any]], on_error: Callable[[Any, BaseException], None]
                    ) -> list[dict[str, Any]]:
    """Call each provider (from ``dledger_status_sections``); a list or one section each; a failing one is
    reported to ``on_error`` and shown as a section saying so, never failing the page."""
    out: list[dict[str, Any]] = []
    for provider in providers:
        try:
            got = provider()
        except Exception as e:
            on_error(provider, e)
            name = getattr(provider, "__qualname__", type(provider).__name__)
            out.append(section("error", f"{name}: unavailable", summary=[("error", f"{type(e).__name__}: {e}")]))
            continue
        if got is None:
            continue
        out.extend([got] if isinstance(got, dict) else list(got))
    return out


def status_document(server: Any, board: Any, now: float) -> dict[str, Any]:
    """The whole ``/status.json`` document; ``board`` is the :class:`~dledger.status.board.StatusBoard`."""
    cfg = server.config
    doc: dict[str, Any] = {"group": cfg.group, "self_id": cfg.self_id, "now": round(now, 3),
                           "running": bool(server.running)}
    doc.update(member_status(server, now=now, disk_used_ratio=board.disk_used_ratio))
    events = getattr(server, "role_events", None)
    doc["events"] = [e.to_json() for e in events.newest_first()] if events is not None else []
    doc["series"] = board.history.series()
    doc["sections"] = plugin_sections(board.providers_for(server), board.provider_failed)
    return doc
