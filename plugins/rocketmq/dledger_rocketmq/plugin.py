"""The pluggy plugin module registered in the ``dledger`` entry-point group.

The plugin is installed in every test environment of the repository, so it
does **nothing** on a member unless ``rocketmq.enabled`` is true: every hook
returns no handler, hook, listener or service then.  With it, each member
gets one :class:`dledger_rocketmq.broker.Broker` (made on first use by any
hook, kept per server): its append hook, its role-change handler and
leader-ready listener (roles), and the broker itself as a service (which
loads its metadata and registers the consume-queue dispatcher on the commit
feed once the store is recovered; its metadata persists as a child service),
plus the broker port (:mod:`dledger_rocketmq.port`) when ``rocketmq.listen`` is set
and the name-server registration (:mod:`dledger_rocketmq.registration`, which also
gives the slave metadata sync its ``fetch``) when ``rocketmq.namesrvAddr`` is set.
The one exception to "inert": ``rocketmq.namesrvListen`` runs a name server
(:mod:`dledger_rocketmq.namesrv`) inside the member even without the broker.
"""

from __future__ import annotations

import weakref

from dledger.hookspecs import hookimpl
from dledger.plugin_types import ExtraOption
from dledger_rocketmq.broker import Broker, BrokerOptions, parse_host
from dledger_rocketmq.message import DEFAULT_MAX_MESSAGE_SIZE

_brokers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ports: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_fetchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_registrations: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_namesrvs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def host_option(value) -> str:
    """``ip:port`` checked when the config is read (a bad value is a one-line option error, not a traceback)."""
    text = str(value)
    addr = parse_host(text)
    addr.packed()  # a host that is no IP address, or a port out of range, raises here
    return text


def unit_multiple(value) -> int:
    """A consume-queue file size: a positive multiple of the 20-byte unit."""
    n = int(value)
    if n <= 0 or n % 20:
        raise ValueError(f"{n} is not a positive multiple of 20")
    return n


def positive_seconds(value) -> float:
    """A timeout in seconds, > 0 (the master wait must be bounded)."""
    x = float(value)
    if not x > 0:
        raise ValueError(f"{value!r} is not a positive number of seconds")
    return x

def namesrv_addrs(value) -> str:
    """``host:port;host:port`` (RocketMQ's namesrvAddr), checked when the config is read."""
    from dledger_rocketmq.registration import parse_namesrv_addrs

    text = str(value)
    parse_namesrv_addrs(text)
    return text


def positive_ms(value) -> int:
    """A period in milliseconds, > 0."""
    n = int(value)
    if n <= 0:
        raise ValueError(f"{value!r} is not a positive number of milliseconds")
    return n


def server_endpoint(value) -> str:
    """A server endpoint description that parses (``tcp:9876:interface=127.0.0.1``); empty: none."""
    text = str(value)
    if text:
        from twisted.internet import reactor
        from twisted.internet.endpoints import serverFromString

        try:
            serverFromString(reactor, text)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{text!r} is not a server endpoint (e.g. tcp:9876:interface=127.0.0.1): {exc}"
                             ) from None
    return text


namesrv_addrs.__name__ = "host:port;..."
positive_ms.__name__ = "int ms > 0"
server_endpoint.__name__ = "endpoint"
# What `twistd dledger --help` prints as these options' types.
host_option.__name__ = "ip:port"
unit_multiple.__name__ = "int, multiple of 20"
positive_seconds.__name__ = "float > 0"

#: Option name (``rocketmq.<name>``) -> (BrokerOptions field, default, type, help).
OPTIONS = {
    "enabled": ("enabled", False, bool, "run the RocketMQ broker layer on this member (default: off, inert)"),
    "brokerName": ("broker_name", "broker-a", str, "RocketMQ brokerName of this group"),
    "brokerClusterName": ("cluster_name", "DefaultCluster", str,
                          "RocketMQ brokerClusterName (its system topics in config/topics.json)"),
    "storeDir": ("store_dir", "", str, "broker store root (consumequeue/, config/); '{id}' is the member id; "
                 "default <storeBaseDir>/rocketmq-<selfId>"),
    "storeHost": ("store_host", "127.0.0.1:10911", host_option,
                  "STOREHOST of records and message ids (brokerIP1:port)"),
    "maxMessageSize": ("max_message_size", DEFAULT_MAX_MESSAGE_SIZE, int, "largest record in bytes"),
    "mappedFileSizeConsumeQueue": ("consume_queue_file_size", 300_000 * 20, unit_multiple,
                                   "consume-queue file size in bytes (a multiple of 20)"),
    "masterWaitTimeout": ("master_wait_timeout", 30.0, positive_seconds,
                          "seconds a new leader waits for commit + dispatch before handing leadership on"),
    "flushConsumeQueueInterval": ("flush_interval", 1.0, float,
                                  "seconds between consume-queue fsyncs (0: at stop only)"),
    "flushConsumerOffsetInterval": ("persist_interval", 5.0, float,
                                    "seconds between writes of changed config/*.json metadata (0: at stop only)"),
    "offsetCheckInSlave": ("offset_check_in_slave", False, bool, "a slave corrects bad pull offsets too"),
    "forwardSendsToMaster": ("forward_sends", True, bool, "a slave forwards sends to the master it learned from "
                             "the name server instead of refusing them (needs namesrvAddr)"),
    "storePathCommitLog": ("commitlog_dir", "", str, "an existing plain CommitLog directory to continue (migration; "
                           "'{id}' is the member id); empty: none"),
    "mappedFileSizeCommitLog": ("commitlog_file_size", 0, int,
                                "old CommitLog file size in bytes (0: mappedFileSizeForEntryData)"),
    "listen": ("listen", "", str, "the broker port's endpoint (RocketMQ remoting), e.g. "
               "tcp:10911:interface=127.0.0.1; empty: no port"),
    "maxFrameSize": ("max_frame_size", 16 * 1024 * 1024, int, "largest remoting frame the broker port accepts, "
                     "in bytes (a bigger one closes the connection)"),
    "namesrvAddr": ("namesrv_addr", "", namesrv_addrs, "name servers to register with, 'host:port;host:port' "
                    "(RocketMQ's namesrvAddr); empty: no registration"),
    "registerNameServerPeriod": ("register_period_ms", 30_000, positive_ms,
                                 "ms between registrations (also at once on a role or topic change)"),
    "compressedRegister": ("compressed_register", False, bool, "send the zlib-compressed registration body"),
    "namesrvListen": ("namesrv_listen", "", server_endpoint, "run a RocketMQ name server inside this member on this "
                      "endpoint, e.g. tcp:9876:interface=127.0.0.1; empty: none"),
}


def options_for(server) -> BrokerOptions | None:
    """The broker options of ``server``'s config, or None when the broker is not enabled."""
    extras = server.config.extras
    if not extras.get("rocketmq.enabled"):
        return None
    kw = {}
    for name, (fld, default, _type, _help) in OPTIONS.items():
        if fld == "enabled":
            continue
        kw[fld] = extras.get(f"rocketmq.{name}", default)
    return BrokerOptions(**kw)


def broker_for(server) -> Broker | None:
    """The member's Broker (made on first call), or None if ``rocketmq.enabled`` is off."""
    if server in _brokers:
        return _brokers[server]
    options = options_for(server)
    if options is None:
        return None
    kw = {}
    if options.namesrv_addr:  # a slave learns its master from the name servers: the metadata sync can run
        from dledger_rocketmq.registration import MasterFetcher

        fetcher = _fetchers[server] = MasterFetcher(server)
        kw["fetch"] = fetcher.fetch
    broker = _brokers[server] = Broker(server, options, **kw)
    return broker


def port_for(server):
    """The member's BrokerPort service (``rocketmq.listen`` set), or None."""
    return _ports.get(server)


@hookimpl
def dledger_extra_options():
    return [ExtraOption(f"rocketmq.{name}", default, help_, type_)
            for name, (_f, default, type_, help_) in OPTIONS.items()]


@hookimpl
def dledger_append_hooks(server):
    broker = broker_for(server)
    return [broker.commitlog.hook] if broker else []


@hookimpl
def dledger_role_change_handlers(server):
    broker = broker_for(server)
    return [broker.roles] if broker else []


@hookimpl
def dledger_leader_ready_listeners(server):
    broker = broker_for(server)
    return [broker.roles] if broker else []


def registration_for(server):
    """The member's name-server Registration service (``rocketmq.namesrvAddr`` set), or None."""
    return _registrations.get(server)


def namesrv_for(server):
    """The NameServer service run inside the member (``rocketmq.namesrvListen`` set), or None."""
    return _namesrvs.get(server)


@hookimpl
def dledger_services(server, collection):
    listen = server.config.extras.get("rocketmq.namesrvListen")
    if listen:  # a name server inside the member (the broker layer need not be on)
        from dledger.transport.listener import ListenerLimits
        from dledger_rocketmq.namesrv import NameServer

        namesrv = _namesrvs[server] = NameServer(listen, reactor=server.clock,
                                                 limits=ListenerLimits.from_config(server.config))
        namesrv.setServiceParent(collection)
    broker = broker_for(server)
    if broker is not None:
        broker.setServiceParent(collection)
        if broker.options.listen:
            from dledger_rocketmq.port import BrokerPort

            port = _ports[server] = BrokerPort(broker, broker.options.listen,
                                               max_frame_size=broker.options.max_frame_size)
            port.master_fetcher = _fetchers.get(server)  # slaves forward sends to it (dledger_rocketmq.forward)
            port.setServiceParent(collection)
        if broker.options.namesrv_addr:
            from dledger_rocketmq.registration import Registration, parse_namesrv_addrs

            reg = _registrations[server] = Registration(
                broker, parse_namesrv_addrs(broker.options.namesrv_addr),
                period=broker.options.register_period_ms / 1000, compressed=broker.options.compressed_register,
                fetcher=_fetchers.get(server))
            reg.setServiceParent(collection)


@hookimpl
def dledger_cli_commands(subparsers):
    from dledger_rocketmq import cli

    cli.register(subparsers)


@hookimpl
def dledger_bench_subjects(subparsers):
    from dledger_rocketmq import bench

    bench.register(subparsers)
