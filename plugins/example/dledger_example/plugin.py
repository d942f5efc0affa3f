"""The example plugin's hooks: everything dledger calls is in this module, which the entry point names.

Replicated counters: a client appends ``{"add": NAME, "by": N}`` bodies; the leader's append hook
refuses bad ones; every member applies committed ones to its counters (a commit listener), knows its
role (a role-change handler) and, if asked to, serves them as JSON over HTTP (a service); ``dledger
example add`` appends one (a CLI command).  Nothing happens on a member unless ``example.enabled``.
docs/plugins.md walks through it.
"""

from __future__ import annotations

import json
import weakref

from twisted.application import strports
from twisted.logger import Logger
from twisted.web import resource
from twisted.web.server import Site
from zope.interface import implementer

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.hookspecs import hookimpl
from dledger.interfaces import IAppendHook, ICommitListener, IRoleChangeHandler
from dledger.plugin_types import ExtraOption
from dledger.plugins import plugin_options
from dledger_example.counters import Counters, check_add, encode_add

log = Logger()


# -- options -----------------------------------------------------------------------------------------
@hookimpl
def dledger_extra_options():
    """This plugin's options: ``[plugins.example]`` in the TOML file, ``--plugin-opt example.NAME=VALUE``."""
    return [
        ExtraOption("example.enabled", False, "run the example counters on this member", bool),
        ExtraOption("example.max_add", 1000, "the largest 'by' an add may carry (the leader refuses more)", int),
        ExtraOption("example.listen", None, "serve the counters as JSON over HTTP on this endpoint, "
                                            "e.g. tcp:8080:interface=127.0.0.1 (unset: no HTTP)", str),
    ]


# -- one member's state --------------------------------------------------------------------------------
class Example:
    """What the plugin keeps for one member: its options, its counters and its role."""

    def __init__(self, server):
        options = plugin_options(server.config, "example")  # {"enabled": ..., "max_add": ..., "listen": ...}
        self.member_id = server.config.self_id
        self.max_add = options["max_add"]
        self.listen = options["listen"]
        self.counters = Counters()
        # Every member starts as CANDIDATE; handlers are told about changes only, so this is the first role.
        self.role, self.term = server.state.role, server.state.curr_term


_members: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def example_of(server) -> Example | None:
    """The member's Example (made on first use, shared by the hooks below); None unless ``example.enabled``."""
    if not server.config.extras["example.enabled"]:
        return None
    if server not in _members:
        _members[server] = Example(server)
    return _members[server]


# -- role changes ----------------------------------------------------------------------------------------
@implementer(IRoleChangeHandler)
class RoleTracker:
    """Remembers the member's role; a broker would become master or slave here."""

    def __init__(self, example: Example):
        self.example = example

    def role_changed(self, term, role):
        self.example.role, self.example.term = role, term
        log.info("example {id}: now {role} in term {term}", id=self.example.member_id, role=role.name, term=term)


@hookimpl
def dledger_role_change_handlers(server):
    example = example_of(server)
    return [RoleTracker(example)] if example else []


# -- the leader's check of each new entry -----------------------------------------------------------------
@implementer(IAppendHook)
class CheckAdd:
    """Refuses a body that is not an add, or adds more than ``example.max_add``: the client gets APPEND_REFUSED."""

    def __init__(self, example: Example):
        self.example = example

    def before_append(self, entry, buffer, body_offset):
        try:
            check_add(bytes(buffer[body_offset:]), self.example.max_add)
        except ValueError as exc:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"example: {exc}") from None

    def __repr__(self):
        return "<example.CheckAdd>"  # the refusal's message names the hook by its repr


@hookimpl
def dledger_append_hooks(server):
    example = example_of(server)
    return [CheckAdd(example)] if example else []


# -- applying what is committed ------------------------------------------------------------------------
@implementer(ICommitListener)
class Applier:
    """Applies committed entries to the counters, in log order, on every member."""

    def __init__(self, example: Example):
        self.example = example

    def start_index(self):
        return 0  # the counters live in memory: after a restart they are rebuilt from the whole log

    def entries_committed(self, entries):
        for entry in entries:
            self.example.counters.apply(entry.index, entry.body)


@hookimpl
def dledger_commit_listeners(server):
    example = example_of(server)
    return [Applier(example)] if example else []


# -- a service: the counters over HTTP ------------------------------------------------------------------
class CountersPage(resource.Resource):
    """``GET /``: this member's counters, role and applied index as JSON."""

    isLeaf = True

    def __init__(self, example: Example):
        super().__init__()
        self.example = example

    def render_GET(self, request):
        ex = self.example
        request.setHeader(b"content-type", b"application/json")
        return json.dumps({"member": ex.member_id, "role": ex.role.name, "term": ex.term,
                           "applied_index": ex.counters.applied_index, "counters": ex.counters.values},
                          sort_keys=True).encode()


@hookimpl
def dledger_services(server, collection):
    example = example_of(server)
    if example is None or not example.listen:
        return
    site = Site(CountersPage(example))
    site.noisy = False
    service = strports.service(example.listen, site, reactor=server.clock)
    service.setName("example-http")  # start errors and logs name the service and its plugin
    service.setServiceParent(collection)


# -- a command: dledger example add NAME --by N ------------------------------------------------------------
@hookimpl
def dledger_cli_commands(subparsers):
    from dledger.commands.argtypes import positive_int
    from dledger.commands.client import client_parent, command

    p = subparsers.add_parser("example", help="the example plugin's counters",
                              description="Replicated counters (the example plugin, plugins/example).")
    actions = p.add_subparsers(dest="example_command", metavar="ACTION")
    add = actions.add_parser("add", parents=[client_parent()], help="add to a counter (one append)",
                             description="Append one add; prints the entry's index once it is committed.")
    add.add_argument("name", help="the counter")
    add.add_argument("--by", type=positive_int, default=1, help="how much to add (default 1)")
    add.set_defaults(func=command(add_command))
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


async def add_command(client, args, out):
    """Append the add; a refusal (APPEND_REFUSED) is printed by dledger as one line, exit status 1."""
    response = await client.append(encode_add(args.name, args.by))
    if args.json:
        print(json.dumps({"counter": args.name, "by": args.by, "index": response.index}), file=out)
    else:
        print(f"added {args.by} to {args.name}: entry {response.index}", file=out)
    return 0
