"""The broker workload's verdict, as pure functions of its events and the queues read back at the end.

Events (dicts, one per line in ``events.jsonl``):

* ``{"t": "send", "body", "attempt", "inv", "done", "ok", "queue", "offset"}`` -- one send attempt;
  ``queue`` is ``"broker/queueId"``; ``offset`` the acknowledged queue offset (``ok`` only);
* ``{"t": "pull", "session", "queue", "from", "offsets", "bodies", "next"}`` -- one pull that found messages;
* ``{"t": "commit", "queue", "offset", "inv", "done", "ok"}`` -- a consumer offset commit;
* ``{"t": "query", "queue", "offset", "inv", "done"}`` -- the consumer offset the broker answered on a resume.

``final`` maps each queue to ``{offset: body}`` read back from offset 0 once the faults are healed. The rules
(RocketMQ's at-least-once delivery):

* **lost** -- an acknowledged send is not at its acknowledged queue offset;
* **duplicated** -- a body is stored more times than it was sent (a producer resends after a timeout, so a body
  sent k times may be stored up to k times, never more);
* **gap** -- a queue's offsets are not contiguous, or a consumer session's pulls skipped an offset that exists;
* **changed** -- a pull saw a different body at an offset than the queue holds;
* **offset backwards** -- a resume was answered a consumer offset below one whose commit was acknowledged
  before the resume began.
"""

from __future__ import annotations

from collections import Counter


def broker_anomalies(events: list[dict], final: dict[str, dict[int, str]]) -> list[str]:
    out: list[str] = []
    attempts = Counter(e["body"] for e in events if e["t"] == "send")
    stored = Counter(body for q in final.values() for body in q.values())
    for e in events:
        if e["t"] == "send" and e.get("ok"):
            got = final.get(e["queue"], {}).get(e["offset"])
            if got != e["body"]:
                out.append(f"lost: {e['body']} acknowledged at {e['queue']}@{e['offset']}, the queue holds {got}")
    out += [f"duplicated: {body} stored {n} times, sent {attempts[body]} times"
            for body, n in sorted(stored.items()) if n > max(attempts[body], 1)]
    for queue, held in sorted(final.items()):
        if held:
            lo, hi = min(held), max(held)
            missing = [o for o in range(lo, hi + 1) if o not in held]
            if missing:
                out.append(f"gap: {queue} has no message at offsets {missing[:5]} (holds {lo}..{hi})")
    position: dict[tuple[str, str], int] = {}
    for e in events:
        if e["t"] != "pull":
            continue
        held = final.get(e["queue"], {})
        key = (e["session"], e["queue"])
        expect = position.get(key, e["from"])
        for offset, body in zip(e["offsets"], e["bodies"]):
            if held.get(offset) != body:
                out.append(f"changed: a pull saw {body} at {e['queue']}@{offset}, the queue holds {held.get(offset)}")
            if offset > expect and any(o in held for o in range(expect, offset)):
                out.append(f"gap: session {e['session']} pulled {e['queue']}@{offset} after {expect - 1}, "
                           f"skipping stored offsets")
            expect = max(expect, offset + 1)
        position[key] = max(expect, e["next"])
    commits = sorted((e["done"], e["queue"], e["offset"]) for e in events if e["t"] == "commit" and e.get("ok"))
    for e in events:
        if e["t"] != "query":
            continue
        floor = max((o for done, q, o in commits if q == e["queue"] and done < e["inv"]), default=None)
        if floor is not None and e["offset"] < floor:
            out.append(f"offset backwards: {e['queue']} resumed at {e['offset']} after a commit of {floor} "
                       f"was acknowledged")
    return out
