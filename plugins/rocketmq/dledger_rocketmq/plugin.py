"""The pluggy plugin module registered in the ``dledger`` entry-point group.

The plugin is installed in every test environment of the repository, so it
does **nothing** on a member unless ``rocketmq.enabled`` is true: every hook
returns no handler, hook, listener or service then.  With it, each member
gets one :class:`dledger_rocketmq.broker.broker.Broker` (made on first use by any
hook, kept per server): its append hook, its role-change handler and
leader-ready listener (roles), and the broker itself as a service (which
loads its metadata and registers the consume-queue dispatcher on the commit
feed once the store is recovered; its metadata persists as a child service),
plus the broker port (:mod:`dledger_rocketmq.broker.port`) when ``rocketmq.listen`` is set
and the name-server registration (:mod:`dledger_rocketmq.namesrv.registration`, which also
gives the slave metadata sync its ``fetch``) when ``rocketmq.namesrvAddr`` is set.
The broker's metadata is a state machine (:mod:`dledger_rocketmq.store.machine`),
returned by ``dledger_state_machines``: snapshotted and restored with the log.
The one exception to "inert": ``rocketmq.namesrvListen`` runs a name server
(:mod:`dledger_rocketmq.namesrv.namesrv`) inside the member even without the broker.
"""

from __future__ import annotations

import weakref

from twisted.logger import Logger

from dledger.hookspecs import hookimpl
from dledger.plugin_types import ExtraOption
from dledger_rocketmq.broker.broker import Broker, BrokerOptions, parse_host
from dledger_rocketmq.common.message import DEFAULT_MAX_MESSAGE_SIZE

log = Logger()
_brokers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ports: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_fetchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_registrations: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_namesrvs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_member_gates: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
    from dledger_rocketmq.namesrv.registration import parse_namesrv_addrs

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
    "vipListen": ("vip_listen", "", server_endpoint, "a second endpoint of the broker port, RocketMQ's VIP "
                  "channel (a Java broker's listenPort - 2, e.g. tcp:10909:interface=127.0.0.1): Java slaves fetch "
                  "their master's topic configs there, so a group mixed with Java brokers needs it; empty: none"),
    "maxFrameSize": ("max_frame_size", 16 * 1024 * 1024, int, "largest remoting frame the broker port accepts, "
                     "in bytes (a bigger one closes the connection)"),
    "namesrvAddr": ("namesrv_addr", "", namesrv_addrs, "name servers to register with, 'host:port;host:port' "
                    "(RocketMQ's namesrvAddr); empty: no registration"),
    "registerNameServerPeriod": ("register_period_ms", 30_000, positive_ms,
                                 "ms between registrations (also at once on a role or topic change)"),
    "compressedRegister": ("compressed_register", False, bool, "send the zlib-compressed registration body"),
    "namesrvListen": ("namesrv_listen", "", server_endpoint, "run a RocketMQ name server inside this member on this "
                      "endpoint, e.g. tcp:9876:interface=127.0.0.1; empty: none"),
    "aclEnable": ("acl_enable", False, bool, "RocketMQ ACL on the broker port and the name server: requests must be "
                  "signed by an account of rocketmq.aclFile (AclClientRPCHook); the group enforces one ACL, "
                  "carried by the log"),
    "aclFile": ("acl_file", "", str, "a RocketMQ 4.x plain_acl.yml (accounts, globalWhiteRemoteAddresses); "
                "'{id}' is the member id; needed by aclEnable"),
    "allowAnonymous": ("allow_anonymous", False, bool, "start even though authMode is not 'none' and the broker "
                       "port and name server have neither aclEnable nor tlsClientAuth (anyone may write)"),
    "tlsClientAuth": ("tls_client_auth", False, bool, "the broker port speaks TLS with the member's certificate "
                      "(authMode = 'tls'); a client certificate of the group CA is judged by its role "
                      "(read/write/admin), a connection without one by the ACL"),
    "accessKey": ("access_key", "", str, "the account this member signs its own requests with when ACL is on "
                  "(registrations with name servers, the slave metadata sync)"),
    "secretKeyFile": ("secret_key_file", "", str, "file whose first line is accessKey's secretKey; '{id}' is the "
                      "member id"),
    "keepJavaCompatible": ("keep_java_compatible", False, bool, "write only plain CommitLog records even when every "
                           "peer is a dledger member, so a Java broker can still join (the way back of a migration; "
                           "docs/rocketmq.md 'Migrating a RocketMQ DLedger group')"),
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


def _extra(server, name: str):
    return server.config.extras.get(f"rocketmq.{name}", OPTIONS[name][1])


def anonymous_surface_error(*, auth_mode: str, broker_port: bool, namesrv: bool, acl_enable: bool,
                            tls_client_auth: bool, allow_anonymous: bool) -> str | None:
    """Why a member must not start (one line), or None: dledger authenticates its own port (``authMode``) but a
    RocketMQ surface of it would let anyone write (issue #21, "no anonymous writes by accident")."""
    if auth_mode == "none" or allow_anonymous or acl_enable:
        return None
    open_surfaces = [what for what, on in (("the broker port (rocketmq.listen)", broker_port and not tls_client_auth),
                                           ("the name server (rocketmq.namesrvListen)", namesrv)) if on]
    if not open_surfaces:
        return None
    return (f"authMode is {auth_mode!r} but {' and '.join(open_surfaces)} would accept anyone: set "
            "rocketmq.aclEnable = true with rocketmq.aclFile (RocketMQ ACL), or rocketmq.tlsClientAuth = true for "
            "the broker port, or rocketmq.allowAnonymous = true to accept anonymous clients on purpose")


def check_surfaces(server) -> None:
    """Refuse to start (ConfigError, one line) on an anonymous RocketMQ surface of an authenticated member, and on
    ACL options that cannot work."""
    from dledger.errors import ConfigError

    enabled = bool(server.config.extras.get("rocketmq.enabled"))
    why = anonymous_surface_error(
        auth_mode=server.config.auth_mode, broker_port=enabled and bool(_extra(server, "listen")),
        namesrv=bool(_extra(server, "namesrvListen")), acl_enable=bool(_extra(server, "aclEnable")),
        tls_client_auth=bool(_extra(server, "tlsClientAuth")), allow_anonymous=bool(_extra(server, "allowAnonymous")))
    if why is not None:
        raise ConfigError(why)
    if _extra(server, "vipListen") and not _extra(server, "listen"):
        raise ConfigError("rocketmq.vipListen needs rocketmq.listen (it is a second endpoint of the broker port)")
    if _extra(server, "aclEnable") and not _extra(server, "aclFile"):
        raise ConfigError("rocketmq.aclEnable needs rocketmq.aclFile (a RocketMQ plain_acl.yml with the accounts)")
    if _extra(server, "tlsClientAuth") and server.config.auth_mode != "tls":
        raise ConfigError("rocketmq.tlsClientAuth needs authMode = 'tls' (the member's certificate and the group CA)")
    if bool(_extra(server, "accessKey")) != bool(_extra(server, "secretKeyFile")):
        raise ConfigError("rocketmq.accessKey and rocketmq.secretKeyFile go together")


def member_credentials(server):
    """The member's own ACL credentials (rocketmq.accessKey/secretKeyFile), or None; ConfigError if unreadable."""
    from dledger.errors import ConfigError
    from dledger_rocketmq.common.acl import AclConfigError, Credentials

    ak = _extra(server, "accessKey")
    if not ak:
        return None
    try:
        return Credentials.from_file(ak, _extra(server, "secretKeyFile").replace("{id}", server.self_id))
    except AclConfigError as exc:
        raise ConfigError(f"rocketmq.secretKeyFile: {exc}") from None


def acl_for(server):
    """The ACL of rocketmq.aclFile (read at start; ConfigError with one line for a bad file), or None."""
    from dledger.errors import ConfigError
    from dledger_rocketmq.common.acl import AclConfigError, load_acl_file

    if not _extra(server, "aclEnable"):
        return None
    try:
        return load_acl_file(_extra(server, "aclFile").replace("{id}", server.self_id))
    except AclConfigError as exc:
        raise ConfigError(f"rocketmq.aclFile: {exc}") from None


def _access_for(server, broker):
    """The broker port's PortAccess (ACL and/or client-certificate roles), or None when neither is on."""
    from dledger.errors import ConfigError
    from dledger_rocketmq.broker.port_acl import PortAccess
    from dledger_rocketmq.common.acl import AclConfigError

    acl_enable, tls_auth = bool(_extra(server, "aclEnable")), bool(_extra(server, "tlsClientAuth"))
    if not (acl_enable or tls_auth):
        return None, None
    identify, tls_options = None, None
    if tls_auth:
        from dledger.security.guard import ServerGuard

        guard = ServerGuard.from_config(server.config, server.clock)
        tls_options = guard.tls_options

        def identify(conn):
            role = getattr(conn, "certificate_role", False)
            if role is False:  # once per connection: the handshake is done when its first request arrives
                identity = guard.identify_tls(conn.transport, conn.born_host.host)
                role = conn.certificate_role = None if identity.kind == "anonymous" else identity.role
            return role
    try:
        access = PortAccess(broker, acl_file=_extra(server, "aclFile").replace("{id}", server.self_id),
                            enabled=acl_enable, identify=identify, clock=server.clock)
    except AclConfigError as exc:
        raise ConfigError(f"rocketmq.aclFile: {exc}") from None
    return access, tls_options


def broker_for(server) -> Broker | None:
    """The member's Broker (made on first call), or None if ``rocketmq.enabled`` is off."""
    if server in _brokers:
        return _brokers[server]
    options = options_for(server)
    if options is None:
        return None
    kw = {}
    if options.namesrv_addr:  # a slave learns its master from the name servers: the metadata sync can run
        from dledger_rocketmq.namesrv.registration import MasterFetcher

        tls_options = None
        if _extra(server, "tlsClientAuth"):  # the master's port speaks TLS: present the member's certificate
            from dledger.security.guard import ClientCredentials

            member = ClientCredentials.for_member(server.config)  # None without TLS: check_surfaces says why
            tls_options = member.tls_options if member is not None else None
        fetcher = _fetchers[server] = MasterFetcher(server, credentials=member_credentials(server),
                                                    tls_options=tls_options)
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


@hookimpl(optionalhook=True)
def dledger_state_machines(server):
    """The broker's metadata machine ("rocketmq"): restored from snapshots and fed by the member's state machines.

    ``optionalhook``: on a dledger without the hook the broker feeds the
    machine from the commit feed itself (no snapshots).
    """
    broker = broker_for(server)
    return [broker.machine] if broker else []


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


def member_gate_for(server):
    """The member's :class:`~dledger_rocketmq.broker.membership.MemberRegistration` (registration's gate), or None."""
    return _member_gates.get(server)


def namesrv_for(server):
    """The NameServer service run inside the member (``rocketmq.namesrvListen`` set), or None."""
    return _namesrvs.get(server)


@hookimpl
def dledger_services(server, collection):
    check_surfaces(server)
    listen = server.config.extras.get("rocketmq.namesrvListen")
    broker = broker_for(server)
    if listen:  # a name server inside the member (the broker layer need not be on)
        from dledger.transport.listener import ListenerLimits
        from dledger_rocketmq.namesrv.namesrv import NameServer

        acl = None
        if _extra(server, "aclEnable"):  # the group's ACL when the broker runs here, else the member's file
            file_acl = acl_for(server)
            meta_acl = broker.meta.acl if broker is not None else None
            acl = (lambda: (meta_acl.config if meta_acl is not None else None) or file_acl)
        namesrv = _namesrvs[server] = NameServer(listen, reactor=server.clock, acl=acl,
                                                 limits=ListenerLimits.from_config(server.config))
        namesrv.setServiceParent(collection)
    if broker is not None:
        broker.setServiceParent(collection)
        if broker.options.listen:
            from dledger_rocketmq.broker.port import BrokerPort

            access, tls_options = _access_for(server, broker)
            port = _ports[server] = BrokerPort(broker, broker.options.listen,
                                               max_frame_size=broker.options.max_frame_size, access=access,
                                               tls_options=tls_options, vip_endpoint=broker.options.vip_listen)
            if access is not None and access.file_config is not None:
                broker.master_callbacks.append(access.on_master)
            if access is not None and access.enabled and broker.options.namesrv_addr and not _extra(server,
                                                                                                  "accessKey"):
                log.warn("{id}: rocketmq.aclEnable without rocketmq.accessKey: this member's requests to the master "
                         "(slave metadata sync) and to name servers with ACL are unsigned and will be refused",
                         id=server.self_id)
            port.master_fetcher = _fetchers.get(server)  # slaves forward sends to it (dledger_rocketmq.broker.forward)
            port.setServiceParent(collection)
        if broker.options.namesrv_addr:
            from dledger_rocketmq.namesrv.registration import Registration, parse_namesrv_addrs

            reg = _registrations[server] = Registration(
                broker, parse_namesrv_addrs(broker.options.namesrv_addr),
                period=broker.options.register_period_ms / 1000, compressed=broker.options.compressed_register,
                fetcher=_fetchers.get(server), credentials=member_credentials(server))
            from dledger_rocketmq.broker.membership import MemberRegistration

            gate = _member_gates[server] = MemberRegistration(broker)
            gate.attach(reg)  # a new member registers once caught up; a removed one unregisters (issue #23)
            reg.setServiceParent(collection)


@hookimpl
def dledger_cli_commands(subparsers):
    from dledger_rocketmq.client import cli

    cli.register(subparsers)


@hookimpl
def dledger_bench_subjects(subparsers):
    from dledger_rocketmq.tools import bench, bench_java

    bench.register(subparsers)
    bench_java.register(subparsers)


@hookimpl
def dledger_status_sections(server):
    """The broker's topics, queues, consumer groups and delayed messages on the status page."""
    from dledger_rocketmq.broker import status

    broker = broker_for(server)
    return [status.status_provider(server, broker, lambda: port_for(server), lambda: member_gate_for(server))] \
        if broker else []


@hookimpl
def dledger_metric_families(server):
    """``rocketmq_*`` families: dispatch lag, queue max offsets, consumer offsets and lag, delayed messages
    (dledger_rocketmq.broker.status), and the broker port's runtime statistics (dledger_rocketmq.broker.brokerstats)."""
    from dledger_rocketmq.broker import status

    broker = broker_for(server)
    if not broker:
        return []

    def runtime_stats():
        port = _ports.get(server)
        if port is None:
            return []
        from dledger_rocketmq.broker.brokerstats import metric_families

        return metric_families(port.broker_stats, server.config.group, server.self_id)
    return [status.metrics_provider(server, broker, lambda: port_for(server)), runtime_stats]
