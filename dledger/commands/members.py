"""``dledger members list|add|promote|remove|replace``: the group's configuration, changed one member at a time.

Every sub-command takes the client options of ``dledger append`` (``--peers``/``--group``/``--config``,
``--timeout``, ``--json``, the TLS and token options; the MEMBERS request needs an ``admin`` client when
authentication is on).  A change goes to the leader and is reported once its configuration entry is
committed; a refusal (no quorum for the new configuration, another change in flight, a Java DLedger
member in the group, an unknown member) is one line, exit status 1.  See docs/operations.md
"Replacing a member" and "Growing a group".
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from dledger.commands.argtypes import positive_float
from dledger.commands.client import client_parent, command, emit
from dledger.membership.configuration import ConfigurationError, check_member


def member_address(text: str) -> tuple[str, str]:
    """``ID=HOST:PORT`` -> ``(id, "host:port")``; a usage error (exit 2) naming what is wrong otherwise."""
    mid, eq, address = text.partition("=")
    if not eq:
        raise argparse.ArgumentTypeError(f"expected ID=HOST:PORT, got {text!r}")
    try:
        check_member(mid.strip(), address.strip())
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return mid.strip(), address.strip()


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "members", help="list or change the group's members (admin role)",
        description="List the group's configuration (members, their addresses and roles: voter or learner), or "
                    "change it one member at a time on the leader: add a member (a learner, promoted to voter "
                    "by the leader once it is within learnerPromoteLag entries), promote a learner, remove a "
                    "member, or replace one by another (add, wait until a voter, remove). The new member must "
                    "be running with --join (joinExisting). See docs/operations.md.")
    sub = p.add_subparsers(dest="members_command", metavar="ACTION")
    sub.required = True
    common = client_parent()

    s = sub.add_parser("list", parents=[common], help="the configuration in force, with each member's role",
                       description="Print the configuration the leader (or --member) uses: each member's id, "
                                   "address and role, the index of the configuration's entry and whether it is "
                                   "committed.")
    s.add_argument("--member", help="ask only this member (its own view, which may lag behind the leader's)")
    s.set_defaults(func=command(do_list))

    s = sub.add_parser("add", parents=[common], help="add a member (a learner until it caught up)",
                       description="Add a member started with --join. It joins as a learner; the leader promotes "
                                   "it to voter once it is within learnerPromoteLag entries, unless --learner.")
    s.add_argument("new", type=member_address, metavar="ID=HOST:PORT", help="the new member's id and address")
    s.add_argument("--learner", action="store_true", help="keep it a learner until 'dledger members promote'")
    s.set_defaults(func=command(do_add))

    s = sub.add_parser("promote", parents=[common], help="make a learner a voter",
                       description="Make a learner a voter (it then votes and counts toward the quorum).")
    s.add_argument("id", metavar="ID", help="the learner's id")
    s.set_defaults(func=command(do_promote))

    s = sub.add_parser("remove", parents=[common], help="remove a member",
                       description="Remove a voter or a learner. Removing the leader makes it hand leadership "
                                   "over once the change is committed; a removed member stops serving.")
    s.add_argument("id", metavar="ID", help="the member's id")
    s.set_defaults(func=command(do_remove))

    s = sub.add_parser("replace", parents=[common], help="replace a member by a new one (add, promote, remove)",
                       description="Add NEW (started with --join), wait until it is a voter (the leader promotes "
                                   "it once caught up; this promotes it if the leader does not), then remove OLD; "
                                   "one change at a time, each step printed. Run it again after an interruption: "
                                   "it skips the steps already done.")
    s.add_argument("old", metavar="OLD", help="the member to replace (it may be down)")
    s.add_argument("new", type=member_address, metavar="NEW=HOST:PORT", help="the new member's id and address")
    s.add_argument("--wait", type=positive_float, default=600.0, metavar="SECONDS",
                   help="how long the new member may take to catch up and become a voter (default 600)")
    s.set_defaults(func=command(do_replace))


def view_json(view: Any) -> dict:
    return view.to_json()


def view_text(view: Any) -> list[str]:
    config = view.configuration
    where = "the bootstrap --peers" if config.index == 0 else f"entry {config.index}"
    state = "committed" if view.committed else f"not committed yet (committed up to {view.committed_index})"
    lines = [f"configuration {where}, {state}; answered by {view.member}"]
    for m in config.members:
        role = m.role.value + (" (promoted once caught up)" if m.promote and not m.voter else "")
        lines.append(f"  {m.id:4} {m.address:21} {role}")
    return lines


def show(out, args, view: Any, headline: str | None = None) -> None:
    if args.json:
        print(json.dumps(view_json(view), sort_keys=True), file=out)
        return
    if headline:
        print(headline, file=out)
    for line in view_text(view):
        print(line, file=out)


async def do_list(client, args, out) -> int:
    view = await client.members(member=args.member)
    show(out, args, view)
    return 0


async def do_add(client, args, out) -> int:
    mid, address = args.new
    view = await client.add_member(mid, address, learner=args.learner)
    show(out, args, view, f"added {mid}={address} as a learner" + ("" if args.learner else
                                                                   " (the leader promotes it once caught up)"))
    return 0


async def do_promote(client, args, out) -> int:
    view = await client.promote_member(args.id)
    show(out, args, view, f"promoted {args.id} to voter")
    return 0


async def do_remove(client, args, out) -> int:
    view = await client.remove_member(args.id)
    show(out, args, view, f"removed {args.id}")
    return 0


async def do_replace(client, args, out) -> int:
    mid, address = args.new

    def progress(line: str) -> None:
        emit(out, args, {"step": line}, line)
        out.flush()

    view = await client.replace_member(args.old, mid, address, progress=progress, catch_up_timeout=args.wait)
    show(out, args, view)
    return 0
