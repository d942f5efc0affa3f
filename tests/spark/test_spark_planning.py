"""The data source's pure parts: option parsing, planning decisions, and the executor read loop on a fake client."""

import json

import pytest

from dledger.codes import ResponseCode
from dledger.entry import Entry
from dledger.errors import DLedgerError

pytest.importorskip("dledger_spark", reason="dledger-spark is not installed (pip install -e spark)")

from dledger_spark import planning
from dledger_spark.options import OptionError, parse_options
from dledger_spark.reader import Partition, SourceError, read_entries

PEERS = "n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913"


def test_options_defaults():
    """peers + group: one group, earliest to latest, leader reads, raw rows, failOnDataLoss on."""
    o = parse_options({"peers": PEERS, "group": "g0"})
    assert o.groups == {"g0": PEERS} and o.starting == {"g0": "earliest"} and o.ending == {"g0": "latest"}
    assert (o.read_from, o.format, o.fail_on_data_loss, o.max_entries_per_trigger) == ("leader", "raw", True, None)


def test_options_are_case_insensitive_and_groups_take_json():
    """Spark lower-cases option names; groups as JSON {group: peers} with per-group startingIndex JSON."""
    groups = json.dumps({"b": PEERS, "a": PEERS})
    o = parse_options({"groups": groups, "startingindex": '{"a": 5}',
                       "maxentriespertrigger": "100", "readfrom": "ANY", "failondataloss": "false"})
    assert list(o.groups) == ["a", "b"] and o.starting == {"a": 5, "b": "earliest"}
    assert (o.max_entries_per_trigger, o.read_from, o.fail_on_data_loss) == (100, "any", False)
    assert parse_options({"groups": "x, y", "peers": PEERS}).groups == {"x": PEERS, "y": PEERS}


@pytest.mark.parametrize("options, message", [
    ({}, "option 'peers' is required"),
    ({"peers": "nonsense"}, "peers of group 'default'"),
    ({"peers": PEERS, "group": "g", "groups": "h"}, "exclude each other"),
    ({"groups": "g0,g1"}, "'peers' is needed too"),
    ({"groups": "{not json"}, "option 'groups': invalid JSON"),
    ({"peers": PEERS, "readFrom": "nearest"}, "option 'readFrom': expected leader | follower | any"),
    ({"peers": PEERS, "format": "avro"}, "option 'format'"),
    ({"peers": PEERS, "startingIndex": "-3"}, "an index is >= 0"),
    ({"peers": PEERS, "startingIndex": "soon"}, "expected earliest | latest or an index"),
    ({"peers": PEERS, "startingIndex": '{"zz": 1}'}, "unknown group"),
    ({"peers": PEERS, "endingIndex": "earliest"}, "option 'endingIndex': expected latest or an index"),
    ({"peers": PEERS, "maxEntriesPerTrigger": "0"}, "must be more than 0"),
    ({"peers": PEERS, "failOnDataLoss": "maybe"}, "expected true or false"),
    ({"peers": PEERS, "timeout": "x"}, "option 'timeout': expected a positive number"),
])
def test_bad_options_are_one_line_errors(options, message):
    """Each malformed option raises OptionError naming it."""
    with pytest.raises(OptionError, match=message) as err:
        parse_options(options)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("spec, begin, committed, start", [
    ("earliest", 0, 10, 0), ("earliest", 7, 10, 7), ("earliest", -1, -1, 0),
    ("latest", 0, 10, 11), (4, 7, 10, 4),
])
def test_resolve_start(spec, begin, committed, start):
    """earliest is the log's first entry, latest the first uncommitted index, N itself."""
    assert planning.resolve_start(spec, begin, committed) == start


@pytest.mark.parametrize("spec, committed, end", [("latest", 10, 11), (5, 10, 5), (50, 10, 11), ("latest", -1, 0)])
def test_resolve_end_never_passes_the_commit(spec, committed, end):
    """A batch read ends at endingIndex, but never past the committed index + 1."""
    assert planning.resolve_end(spec, committed) == end


@pytest.mark.parametrize("start, latest, limit, end", [
    ({"a": 0}, {"a": 100}, None, {"a": 100}),
    ({"a": 0}, {"a": 100}, 30, {"a": 30}),
    ({"a": 0, "b": 0}, {"a": 90, "b": 10}, 50, {"a": 45, "b": 5}),      # shared in proportion
    ({"a": 0, "b": 0, "c": 0}, {"a": 1, "b": 1, "c": 1}, 2, {"a": 1, "b": 1, "c": 0}),  # remainder by name
    ({"a": 10}, {"a": 5}, None, {"a": 10}),                            # never backwards
    ({"a": 10, "b": 3}, {"a": 10, "b": 3}, 7, {"a": 10, "b": 3}),       # nothing new
])
def test_admit(start, latest, limit, end):
    """maxEntriesPerTrigger caps a micro-batch, shared out deterministically; offsets never go back."""
    got = planning.admit(start, latest, limit)
    assert got == end
    assert limit is None or sum(got[g] - start[g] for g in start) <= limit


def test_split_and_partition_size():
    """Ranges cover [start, end) exactly; a partition holds partition_bytes worth of entries (at least one)."""
    ranges = planning.split("g", 5, 23, 7)
    assert [(r.start, r.end) for r in ranges] == [(5, 12), (12, 19), (19, 23)]
    assert planning.split("g", 5, 5, 7) == []
    assert planning.entries_per_partition(4 << 20, 1072) == 3912 and planning.entries_per_partition(10, 1072) == 1


class FakeClient:
    """Serves GETs from a list of entries (NOOP-free reads), scripted errors first."""

    def __init__(self, entries, begin=0, errors=(), follower_committed=None):
        self.entries = {e.index: e for e in entries}
        self.begin = begin
        self.errors = list(errors)
        self.follower_committed = follower_committed
        self.calls = []

    def get(self, index, count=1, member=None):
        self.calls.append((index, count, member))
        if self.errors:
            raise self.errors.pop(0)
        if index < self.begin:
            raise DLedgerError(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN, "gone")
        top = max(self.entries)
        if member is not None and self.follower_committed is not None:
            if index > self.follower_committed:
                raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE, "behind")
            top = self.follower_committed
        return [self.entries[i] for i in range(index, min(index + 3, top + 1)) if i in self.entries]

    def find_leader(self):
        class Meta:
            ledger_begin_index = self.begin
        return Meta()


def log(n, noops=()):
    return [Entry(b"%d" % i, index=i, term=1, pos=i * 50) for i in range(n) if i not in noops]


def indexes(batches):
    return [e.index for batch in batches for e in batch]


def test_read_stops_at_the_range_end_even_if_the_member_has_more():
    """Entries at or past the partition's end are never returned (the end was the committed index + 1)."""
    client = FakeClient(log(20))
    assert indexes(read_entries(Partition("g", PEERS, 2, 9), client)) == list(range(2, 9))


def test_read_skips_noops_and_ends_when_the_rest_are_noops():
    """NOOP indexes are absent from the rows; a range whose tail is NOOPs ends without waiting."""
    client = FakeClient(log(12, noops={3, 7, 8, 9}))
    assert indexes(read_entries(Partition("g", PEERS, 0, 10), client)) == [0, 1, 2, 4, 5, 6]


def test_deleted_range_fails_loudly_by_default_and_is_skipped_otherwise():
    """INDEX_LESS_THAN_LOCAL_BEGIN from the leader: SourceError naming the lost indexes, or (no failOnDataLoss) skip."""
    with pytest.raises(SourceError, match=r"entries 2\.\.4 of group 'g' were deleted by retention"):
        list(read_entries(Partition("g", PEERS, 2, 9), FakeClient(log(10), begin=5)))
    got = read_entries(Partition("g", PEERS, 2, 9, fail_on_data_loss=False), FakeClient(log(10), begin=5))
    assert indexes(got) == [5, 6, 7, 8]


def test_lagging_follower_hands_over_to_the_leader_with_readFrom_any():
    """readFrom=any: a follower behind the range is left at once for the leader; every index is read once."""
    client = FakeClient(log(10), follower_committed=4)
    part = Partition("g", PEERS, 0, 10, members=("n1", "n2"), read_from="any")
    assert indexes(read_entries(part, client)) == list(range(10))
    assert any(member is None for _, _, member in client.calls) and client.calls[0][2] == "n1"


def test_unreachable_group_gives_up_after_timeout_without_progress():
    """Errors with no progress for `timeout` seconds end the read with a SourceError naming the last error."""
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]

    client = FakeClient(log(5), errors=[DLedgerError(ResponseCode.NETWORK_ERROR, "refused")] * 100)
    with pytest.raises(SourceError, match="no progress reading group 'g' at index 0 for 3s"):
        list(read_entries(Partition("g", PEERS, 0, 5, timeout=3.0), client, clock=clock))


def test_ingest_bad_option_is_one_line_and_exit_2(tmp_path, capsys):
    """dledger ingest with a malformed option prints one line naming it and exits 2 (no Spark started)."""
    from dledger import cli

    status = cli.main(["ingest", "--peers", PEERS, "--group", "g0", "--output", str(tmp_path / "o"),
                       "--starting-index", "soon"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip() == ("dledger ingest: option 'startingIndex': expected earliest | latest or an index, "
                           "got 'soon'")


def test_ingest_unreachable_group_is_one_line_and_exit_1(tmp_path, capsys):
    """dledger ingest against a group nobody answers for fails in --timeout seconds with one line, exit 1."""
    from dledger import cli
    from dledger.launcher import free_ports

    port = free_ports(1)[0]
    status = cli.main(["ingest", "--peers", f"n0-127.0.0.1:{port}", "--group", "g0", "--output",
                       str(tmp_path / "o"), "--timeout", "1.5", "--once"])
    err = capsys.readouterr().err.strip()
    assert status == 1 and "\n" not in err
    assert err.startswith("dledger ingest: dledger source: no leader of group 'g0'")
    assert list(tmp_path.iterdir()) == []  # neither the output nor its checkpoint


def test_planning_waits_out_an_election():
    """The driver asks again while no leader answers (an election), and gives up with one line after `timeout`."""
    from dledger_spark.source import Planner

    class Electing:
        def __init__(self, failures):
            self.failures = failures

        def find_leader(self):
            if self.failures:
                self.failures -= 1
                raise DLedgerError(ResponseCode.NOT_LEADER, "no leader found")

            class Meta:
                committed_index, ledger_begin_index, leader_id = 41, 0, "n1"
                response_code = ResponseCode.SUCCESS
            return Meta()

    planner = Planner(parse_options({"peers": PEERS, "group": "g0", "timeout": "5"}))
    planner._clients["g0"] = Electing(failures=3)
    assert planner.latest() == {"g0": 42}
    planner = Planner(parse_options({"peers": PEERS, "group": "g0", "timeout": "0.3"}))
    planner._clients["g0"] = Electing(failures=10**6)
    with pytest.raises(SourceError, match=r"no leader of group 'g0' at .* answered within 0.3s"):
        planner.latest()


# -- issue #21: unknown options, credentials, foreign checkpoints, wrong groups (one line each) ---------------

@pytest.mark.parametrize("name, closest", [
    ("maxOffsetsPerTrigger", "maxEntriesPerTrigger"), ("startingOffsets", "startingIndex"),
    ("endingOffsets", "endingIndex"), ("maxoffsetspertrigger", "maxEntriesPerTrigger"),
    ("kafka.bootstrap.servers", "peers"), ("tls-ca", "tlsCa"), ("token_file", "tokenFile"),
    ("paritionBytes", "partitionBytes"),
])
def test_unknown_option_is_refused_naming_the_closest_one(name, closest):
    """An option the source does not know (Kafka's names first) is refused, naming the one meant; not ignored."""
    with pytest.raises(OptionError) as err:
        parse_options({"peers": PEERS, "group": "g0", name: "5"})
    assert str(err.value).startswith(f"unknown option {name!r}: did you mean {closest!r}?")
    assert "\n" not in str(err.value)


def test_unknown_option_without_a_close_one_lists_the_options():
    """Nothing close: the message lists every option."""
    with pytest.raises(OptionError, match=r"unknown option 'colour': the options are peers, group, .*tokenFile"):
        parse_options({"peers": PEERS, "colour": "red"})


@pytest.fixture(name="certdir", scope="module")
def certdir_fixture(tmp_path_factory):
    """CA, member and client certificates and tokens of group g0 (dledger certs init)."""
    from dledger.security.certs import ClientSpec, init_group

    d = tmp_path_factory.mktemp("certs")
    init_group(d, "g0", ["n0", "n1", "n2"], [ClientSpec("reader", "read")])
    token = next(x for x in (d / "clients.txt").read_text().splitlines() if x.startswith("reader "))
    (d / "reader.token").write_text(token.split()[2] + "\n")
    return d


def test_credential_options_are_the_cli_credentials(certdir):
    """tlsCa/tlsCert/tlsKey and clientName/tokenFile become the same ClientCredentials the dledger CLI builds."""
    tls = parse_options({"peers": PEERS, "group": "g0", "tlsCa": str(certdir / "ca.crt"),
                         "tlscert": str(certdir / "client-reader.crt"), "TLSKEY": str(certdir / "client-reader.key")})
    creds = tls.credentials.build("g0")
    assert creds.kind == "client" and creds.tls_options is not None and creds.secret is None
    secret = parse_options({"peers": PEERS, "group": "g0", "clientName": "reader",
                            "tokenFile": str(certdir / "reader.token")})
    creds = secret.credentials.build("g0")
    assert (creds.name, creds.tls_options) == ("reader", None) and creds.secret
    assert not parse_options({"peers": PEERS}).credentials and parse_options({"peers": PEERS}).credentials.build("x") \
        is None


@pytest.mark.parametrize("given, message", [
    ({"tlsCert": "c", "tlsKey": "k"}, "options 'tlsCert'/'tlsKey' need 'tlsCa'"),
    ({"tlsCa": "CA", "tlsCert": "c"}, "options 'tlsCert' and 'tlsKey' go together"),
    ({"tokenFile": "t"}, "option 'tokenFile' needs 'clientName'"),
    ({"clientName": "reader"}, "option 'clientName' needs 'tokenFile'"),
    ({"tlsCa": "missing.crt"}, "credentials: .*missing.crt"),
    ({"clientName": "reader", "tokenFile": "missing.token"}, "credentials: .*missing.token"),
])
def test_bad_credential_options_are_one_line_errors(certdir, given, message):
    """Credential options that do not go together, or files that cannot be read, fail at planning in one line."""
    given = {k: (str(certdir / v) if v == "CA" else v) for k, v in given.items()}
    with pytest.raises(OptionError, match=message) as err:
        parse_options({"peers": PEERS, "group": "g0", **given})
    assert "\n" not in str(err.value)


def test_partitions_carry_credentials_as_picklable_paths(certdir):
    """Executors get the credential file paths (a picklable dataclass) and build their own clients from them."""
    import pickle

    from dledger_spark.options import Credentials

    creds = Credentials(tls_ca=str(certdir / "ca.crt"))
    part = pickle.loads(pickle.dumps(Partition("g0", PEERS, 0, 5, credentials=creds)))
    assert part.credentials == creds and part.credentials.build("g0").tls_options is not None


@pytest.mark.parametrize("recorded, configured, refused", [
    ({"g0": 5}, {"g0": PEERS}, None),
    ({"g0": 5}, {"g0": PEERS, "g1": PEERS}, None),           # a group added: starts at its startingIndex
    ({"g0": 5}, {"g1": PEERS}, "g0"),                        # another group's checkpoint
    ({"g0": 5, "g1": 7}, {"g1": PEERS}, "g0"),               # a group dropped
])
def test_foreign_groups(recorded, configured, refused):
    """A checkpoint serves the groups it was started with (and added ones), never others."""
    problem = planning.foreign_groups(recorded, configured)
    assert (problem is None) == (refused is None)
    if refused:
        assert f"offsets of group(s) {refused}," in problem and "new checkpoint location" in problem


def meta(code=ResponseCode.SUCCESS, **fields):
    from dledger.messages import MetadataResponse

    return MetadataResponse(group="g1", code=int(code), **fields)


@pytest.mark.parametrize("code, answer, says", [
    (ResponseCode.UNKNOWN_GROUP, meta(ResponseCode.UNKNOWN_GROUP, leader_id="n2"), "do not serve group 'g1'"),
    (ResponseCode.UNKNOWN_GROUP, None, "do not serve group 'g1'"),
    (ResponseCode.UNKNOWN_MEMBER, None, "check 'peers'"),
    (ResponseCode.NOT_AUTHORIZED, None, "needs credentials with the read role"),
    (ResponseCode.SUCCESS, meta(), "needs credentials with the read role"),          # redacted (no read role)
    (ResponseCode.SUCCESS, meta(leader_id="n0", role="LEADER", ledger_begin_index=0, peers={}), None),
    (ResponseCode.SUCCESS, meta(peers={"n0": "h:1"}), None),                         # a Java candidate: wait
    (ResponseCode.NOT_LEADER, None, None),                                            # an election: wait
    (ResponseCode.TIMEOUT, None, None),
    (ResponseCode.NETWORK_ERROR, "cannot connect to 127.0.0.1:1: Connection refused", None),  # down: wait
    (ResponseCode.NETWORK_ERROR, "127.0.0.1:5 does not know our secret (wrong proof); refusing to talk to it",
     "check 'group'"),                                                                # secret mode, another group
    (ResponseCode.NETWORK_ERROR, "refusing to talk to n0: the server's certificate is not a member certificate of "
                                 "group 'g1' (O='g0', OU='member')", "check 'group'"),  # TLS, another group
    (ResponseCode.NETWORK_ERROR, "127.0.0.1:5 refused the login of client 'reader': unknown", "credentials"),
])
def test_metadata_problem(code, answer, says):
    """A wrong group, wrong member ids, a refused login or a missing read role fail at once; an election waits."""
    error = answer if isinstance(answer, str) else ""
    answer = None if isinstance(answer, str) else answer
    problem = planning.metadata_problem("g1", PEERS, code, answer, error)
    assert (problem is None) == (says is None)
    if says:
        assert says in problem and problem.startswith("dledger source:")


def test_wrong_group_fails_planning_in_one_line():
    """The members answer UNKNOWN_GROUP (echoing a leader, as Java's members do): one line, no TypeError."""
    from dledger_spark.source import Planner

    class OtherGroup:
        def metadata(self, member=None, timeout=None):
            raise DLedgerError(ResponseCode.UNKNOWN_GROUP, "g1 != g0")

        def find_leader(self):
            return meta(ResponseCode.UNKNOWN_GROUP, leader_id="n2")

    for probe in (True, False):
        planner = Planner(parse_options({"peers": PEERS, "group": "g1", "timeout": "5"}))
        planner._clients["g1"] = OtherGroup()
        with pytest.raises(SourceError, match=r"^dledger source: the members at .* do not serve group 'g1'"):
            if probe:
                planner.probe("g1", planner._clients["g1"])
            planner.initial()


def test_stream_refuses_offsets_of_another_group():
    """Offsets from a checkpoint of g0 given to a query of g1: refused in one line before any member is asked."""
    from dledger_spark.source import DLedgerStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    reader = DLedgerStreamReader(parse_options({"peers": PEERS, "group": "g1", "timeout": "0.5"}))
    with pytest.raises(SourceError, match=r"checkpoint holds offsets of group\(s\) g0, which this query does not "
                                          r"read \(it reads g1\)"):
        reader.latestOffset({"g0": 120}, ReadAllAvailable())
    with pytest.raises(SourceError, match="checkpoint holds offsets"):
        reader.partitions({"g0": 120}, {"g0": 130})


def test_read_refused_for_its_role_fails_at_once():
    """NOT_AUTHORIZED on a GET is not retried until the timeout: one line naming the credential options."""
    client = FakeClient(log(5), errors=[DLedgerError(ResponseCode.NOT_AUTHORIZED, "from n0")] * 100)
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]

    with pytest.raises(SourceError, match=r"reading group 'g' was refused: .*tlsCa/tlsCert/tlsKey or "
                                          r"clientName/tokenFile"):
        list(read_entries(Partition("g", PEERS, 0, 5, timeout=600.0), client, clock=clock))
    assert len(client.calls) == 1


def test_ingest_security_flags_are_the_cli_names(certdir):
    """dledger ingest takes the client commands' --tls-ca/--tls-cert/--tls-key/--client-name/--token-file."""
    from dledger_spark.ingest import source_options

    from dledger.cli import build_parser

    args = build_parser().parse_args(["ingest", "--peers", PEERS, "--output", "o", "--tls-ca", "ca", "--tls-cert",
                                      "c", "--tls-key", "k", "--client-name", "n", "--token-file", "t"])
    opts = source_options(args)
    assert {k: opts[k] for k in ("tlsCa", "tlsCert", "tlsKey", "clientName", "tokenFile")} == \
        {"tlsCa": "ca", "tlsCert": "c", "tlsKey": "k", "clientName": "n", "tokenFile": "t"}
    client = build_parser().parse_args(["get", "--index", "0", "--tls-ca", "ca", "--tls-cert", "c", "--tls-key", "k",
                                        "--client-name", "n", "--token-file", "t"])
    assert [getattr(client, a) for a in ("tls_ca", "tls_cert", "tls_key", "client_name", "token_file")] == \
        [getattr(args, a) for a in ("tls_ca", "tls_cert", "tls_key", "client_name", "token_file")]


@pytest.mark.parametrize("layout, says", [
    ("under-a-file", "output {out} cannot be created: {base}/afile is not a directory"),
    ("output-is-a-file", "output {out} cannot be created: {out} is not a directory"),
])
def test_ingest_unwritable_output_is_one_line_and_nothing_written(tmp_path, capsys, layout, says):
    """An output Spark could not write is refused before the group is asked or anything created: one line, exit 1."""
    from dledger import cli

    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "out" if layout == "under-a-file" else tmp_path / "afile"
    ck = tmp_path / "ck"
    status = cli.main(["ingest", "--peers", PEERS, "--group", "g0", "--output", str(out), "--checkpoint", str(ck),
                       "--timeout", "1", "--once"])
    err = capsys.readouterr().err.strip()
    assert status == 1 and err == "dledger ingest: " + says.format(out=out, base=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_ingest_refuses_a_checkpoint_pinned_for_another_group(tmp_path, capsys):
    """The checkpoint's pin file names its groups: a checkpoint of g0 given to an ingest of g1 is refused, unchanged."""
    from dledger import cli

    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "dledger-start.json").write_text('{"g0": 17}')
    status = cli.main(["ingest", "--peers", PEERS, "--group", "g1", "--output", str(tmp_path / "out"),
                       "--checkpoint", str(ck), "--timeout", "1", "--once"])
    err = capsys.readouterr().err.strip()
    assert status == 1 and "\n" not in err
    assert err.startswith(f"dledger ingest: checkpoint {ck}: the checkpoint holds offsets of group(s) g0, which this "
                          "query does not read (it reads g1)")
    assert [p.name for p in ck.iterdir()] == ["dledger-start.json"] and not (tmp_path / "out").exists()
    assert (ck / "dledger-start.json").read_text() == '{"g0": 17}'


@pytest.mark.parametrize("closed, hint", [(True, True), (False, False)])
def test_no_leader_message_suspects_a_tls_port(closed, hint):
    """Members closing plain connections at once are probably TLS ports: the line says to pass tlsCa."""
    error = "TIMEOUT(300): no answer within 3s"
    line = planning.no_leader_message("g0", PEERS, 3.0, error, closed)
    assert line.startswith(f"dledger source: no leader of group 'g0' at {PEERS} answered within 3s: {error}")
    assert ("if they speak TLS, pass tlsCa" in line) == hint


def test_planner_notes_connections_closed_at_once_without_tls():
    """A plain client whose connections are closed at once (a TLS port) fails with the TLS hint; with tlsCa, not."""
    from dledger_spark.source import Planner

    class TLSPort:
        def find_leader(self):
            raise DLedgerError(ResponseCode.NETWORK_ERROR, "connection to h:1 lost: Connection was closed cleanly.")

    planner = Planner(parse_options({"peers": PEERS, "group": "g0", "timeout": "0.2"}))
    planner._clients["g0"] = TLSPort()
    with pytest.raises(SourceError, match="closed the connection at once: if they speak TLS, pass tlsCa"):
        planner.latest()


@pytest.mark.parametrize("limit, first, got", [
    (None, True, planning.FIRST_BATCH_ENTRIES),                      # all available: the first batch is small
    (None, False, None),                                             # then everything
    (planning.FIRST_BATCH_ENTRIES * 5, True, planning.FIRST_BATCH_ENTRIES),
    (300, True, 300),                                                # a smaller limit holds from the start
    (300, False, 300),
])
def test_first_batch_limit(limit, first, got):
    """The first micro-batch of a query is capped at FIRST_BATCH_ENTRIES, the later ones take the limit."""
    assert planning.first_batch_limit(limit, first) == got


class FakePlanner:
    def __init__(self, latest):
        self._latest = latest

    def latest(self):
        return dict(self._latest)

    def initial(self):
        return {g: 0 for g in self._latest}


def test_stream_first_batch_is_small_then_the_rest_follows():
    """latestOffset: the first admitted batch ends FIRST_BATCH_ENTRIES in; the next takes all that is left;
    a reader unpickled elsewhere (a restarted query) starts small again; an empty log does not use up the cap."""
    import pickle

    from dledger_spark.source import DLedgerStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    first = planning.FIRST_BATCH_ENTRIES
    reader = DLedgerStreamReader(parse_options({"peers": PEERS, "group": "g0"}))
    reader._planner = FakePlanner({"g0": 0})
    assert reader.latestOffset({"g0": 0}, ReadAllAvailable()) == {"g0": 0}   # nothing yet: no batch
    reader._planner = FakePlanner({"g0": first * 3 + 7})
    assert reader.latestOffset({"g0": 0}, ReadAllAvailable()) == {"g0": first}
    assert reader.latestOffset({"g0": first}, ReadAllAvailable()) == {"g0": first * 3 + 7}
    again = pickle.loads(pickle.dumps(reader))
    again._planner = FakePlanner({"g0": first * 9})
    assert again.latestOffset({"g0": first * 3 + 7}, ReadAllAvailable()) == {"g0": first * 4 + 7}


@pytest.mark.parametrize("line, ppid, ticks", [
    ("42 (java) S 7 42 42 0 -1 4194560 100 0 0 0 150 30 4 2 20 0 30 0 1 2 3", 7, 186),
    ("43 (py (worker) x) R 42 43 43 0 -1 0 0 0 0 0 5 5 0 0 20 0 1 0 1 2 3", 42, 10),  # spaces, parens in the name
])
def test_proc_stat_fields(line, ppid, ticks):
    """/proc/PID/stat: the parent and user+system CPU ticks (own and reaped children's), whatever the name."""
    from dledger_spark.proctree import stat_fields

    assert stat_fields(line) == (ppid, ticks)


def test_process_tree_leaves_out_excluded_subtrees():
    """The bench charges Spark's processes to the ingest: the tree below a root, the members' subtrees apart."""
    from dledger_spark.proctree import descendants

    parents = {1: 0, 10: 1, 11: 10, 12: 10, 20: 1, 21: 20, 30: 0}
    assert descendants(1, parents) == {1, 10, 11, 12, 20, 21}
    assert descendants(1, parents, {20}) == {1, 10, 11, 12}
    assert descendants(10, parents) == {10, 11, 12}


#: A local driver's JVM: the client compiler, the parallel collector, a first metaspace threshold above an ingest's.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC -XX:MetaspaceSize=256m"


@pytest.mark.parametrize("master, submitted, conf, has, lacks", [
    (None, False, None, {"spark.driver.extraJavaOptions": JVM_OPTIONS, "spark.ui.enabled": "false",
                         "spark.sql.maxConcurrentOutputFileWriters": "4"}, ()),
    ("local[4]", True, None, {"spark.driver.extraJavaOptions": JVM_OPTIONS}, ()),
    ("spark://h:7077", False, None, {"spark.ui.enabled": "false", "spark.sql.maxConcurrentOutputFileWriters": "4"},
     ("spark.driver.extraJavaOptions",)),
    (None, True, {"spark.sql.shuffle.partitions": "8"}, {"spark.sql.shuffle.partitions": "8"},  # spark-submit's hold
     ("spark.driver.extraJavaOptions", "spark.ui.enabled")),
    (None, False, {"spark.driver.extraJavaOptions": "", "spark.ui.enabled": "true"},
     {"spark.driver.extraJavaOptions": "", "spark.ui.enabled": "true"}, ()),  # --conf wins
])
def test_session_conf(master, submitted, conf, has, lacks):
    """A local driver gets the client compiler, the parallel collector and a metaspace threshold; a session this
    command makes (not spark-submit's) writes without the per-task sort; --conf overrides every default."""
    from dledger_spark.session import session_conf

    got = session_conf(master, submitted, conf)
    assert {k: got.get(k) for k in has} == has
    assert not any(k in got for k in lacks)


@pytest.mark.parametrize("path, exists, want", [
    (None, False, ""),
    ("/c/a.jsa", True, "-XX:SharedArchiveFile=/c/a.jsa -Xlog:cds=error,cds+dynamic=error"),
    ("/c/a.jsa.7.tmp", False, "-XX:ArchiveClassesAtExit=/c/a.jsa.7.tmp -Xlog:cds=error,cds+dynamic=error"),
    ("/my cache/a.jsa", True, '-XX:SharedArchiveFile="/my cache/a.jsa" -Xlog:cds=error,cds+dynamic=error'),
])
def test_class_archive_flags(path, exists, want):
    """An archive that exists is mapped; one that does not is recorded at the JVM's exit; a path with spaces quoted."""
    from dledger_spark.session import class_archive_flags

    assert class_archive_flags(path, exists) == want


@pytest.mark.parametrize("env, want", [
    ({"DLEDGER_SPARK_CLASS_ARCHIVE": "off"}, None),
    ({"DLEDGER_SPARK_CLASS_ARCHIVE": ""}, None),
    ({"DLEDGER_SPARK_CLASS_ARCHIVE": "/x/s.jsa", "XDG_CACHE_HOME": "/c"}, "/x/s.jsa"),
    ({"XDG_CACHE_HOME": "/c"}, "/c/dledger-spark/spark-"),  # a prefix: the rest names the version and jar set
])
def test_class_archive_path(env, want):
    """The archive's place: the variable's path, off, or one file per Spark version and jar set in the cache."""
    from dledger_spark.session import class_archive_path

    got = class_archive_path(env)
    if want is None or not want.endswith("-"):
        assert got == want
    else:
        assert got.startswith(want) and got.endswith(".jsa")


def test_session_conf_adds_the_class_archive_to_a_local_driver_only():
    """The archive's flags join the local driver's JVM options; a cluster's driver and --conf are left alone."""
    from dledger_spark.session import LOCAL_JVM_CONF, session_conf

    key = "spark.driver.extraJavaOptions"
    local = session_conf(None, False, None, ("/c/a.jsa", True))[key]
    assert local.startswith(LOCAL_JVM_CONF[key]) and "-XX:SharedArchiveFile=/c/a.jsa" in local
    assert key not in session_conf("spark://h:7077", False, None, ("/c/a.jsa", True))
    assert session_conf(None, False, {key: ""}, ("/c/a.jsa", True))[key] == ""


def _stand_in_jvm(monkeypatch, path: str, exit_code: int):
    """A stand-in for the gateway JVM (writes the archive at ``path`` when its stdin closes, then exits with
    ``exit_code``) installed as SparkContext's gateway, and a session to stop: ``(process, session)``."""
    import subprocess
    import sys

    from pyspark import SparkContext

    script = f"import sys; sys.stdin.read(); open({path!r}, 'wb').write(b'cds'); sys.exit({exit_code})"
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)

    class Gateway:
        def __init__(self):
            self.proc = proc

        def shutdown(self):
            pass

    class Spark:
        stopped = False

        def stop(self):
            self.stopped = True

    monkeypatch.setattr(SparkContext, "_gateway", Gateway())
    monkeypatch.setattr(SparkContext, "_jvm", None)
    return proc, Spark()


@pytest.mark.parametrize("exit_code, kept", [(0, True), (3, False)])
def test_stop_session_keeps_a_recorded_archive_only_once_its_jvm_exited_cleanly(tmp_path, monkeypatch, exit_code, kept):
    """A half-written archive crashes the next JVM (SIGBUS): it is renamed into place only after a clean exit."""
    import os

    from dledger_spark import session
    from pyspark import SparkContext

    final = tmp_path / "cache" / "s.jsa"
    monkeypatch.setenv("DLEDGER_SPARK_CLASS_ARCHIVE", str(final))
    path, exists = session._class_archive(record=True)
    assert (exists, path) == (False, f"{final}.{os.getpid()}.tmp")
    proc, spark = _stand_in_jvm(monkeypatch, path, exit_code)
    session.stop_session(spark, timeout=30)
    assert spark.stopped and proc.returncode == exit_code
    assert final.exists() is kept and not os.path.exists(path)
    assert session._recording is None and SparkContext._gateway is None
    # the next session maps the kept archive, or records again
    assert session._class_archive(record=True) == ((str(final), True) if kept else (path, False))
    session._recording = None


def _fake_pyspark(root, monkeypatch, jars=("spark-core.jar", "scala-library.jar"), size=3):
    """A pyspark install at ``root`` (its ``jars`` directory with ``jars`` of ``size`` bytes) for the archive's key."""
    import pyspark

    (root / "jars").mkdir(parents=True)
    for name in jars:
        (root / "jars" / name).write_bytes(b"j" * size)
    monkeypatch.setattr(pyspark, "__file__", str(root / "__init__.py"))


def test_class_archive_path_differs_per_virtualenv_with_the_same_jar_names(tmp_path, monkeypatch):
    """The JVM checks an archive's class path by absolute path: an archive recorded by another virtualenv's
    pyspark (same version, same jar names) is refused, so each install must have its own (Round 2f)."""
    import pyspark
    from dledger_spark.session import class_archive_path

    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "JAVA_HOME": str(tmp_path / "jdk")}
    _fake_pyspark(tmp_path / "venv-a", monkeypatch)
    a = class_archive_path(env)
    assert class_archive_path(env) == a  # stable for one install
    _fake_pyspark(tmp_path / "venv-b", monkeypatch)
    b = class_archive_path(env)
    assert a != b and a.startswith(str(tmp_path / "cache" / "dledger-spark" / f"spark-{pyspark.__version__}-"))


def test_class_archive_key_follows_what_the_jvm_checks(tmp_path):
    """The key moves with a jar's size or time (the JVM refuses a changed jar) and with the JDK, not otherwise."""
    import os

    from dledger_spark.session import class_archive_key

    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "a.jar").write_bytes(b"abc")
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_bytes(b"java")
    (tmp_path / "jdk" / "lib").mkdir()
    (tmp_path / "jdk" / "lib" / "modules").write_bytes(b"m")
    key = class_archive_key("4.3.0", str(java), str(jars), ["a.jar"])
    assert class_archive_key("4.3.0", str(java), str(jars), ["a.jar"]) == key
    assert class_archive_key("4.3.1", str(java), str(jars), ["a.jar"]) != key
    (tmp_path / "jdk" / "lib" / "modules").write_bytes(b"mm")  # a JDK upgraded in place
    assert class_archive_key("4.3.0", str(java), str(jars), ["a.jar"]) != key
    key = class_archive_key("4.3.0", str(java), str(jars), ["a.jar"])
    st = os.stat(jars / "a.jar")
    os.utime(jars / "a.jar", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert class_archive_key("4.3.0", str(java), str(jars), ["a.jar"]) != key


@pytest.mark.parametrize("source, removed", [
    ("live", False),      # another live virtualenv's archive
    ("gone", True),       # its jars directory was removed (a deleted worktree or virtualenv)
    (None, True),         # no source file: made before archives were keyed by their jars' place
])
def test_prune_archives_removes_only_dead_ones(tmp_path, source, removed):
    """A kept archive prunes the cache's archives no JVM can map any more (~180 MB each), never a live one."""
    from dledger_spark.session import CLASS_ARCHIVE_SOURCE, prune_archives

    (tmp_path / "live").mkdir()
    keep = tmp_path / "spark-4.3.0-aaa.jsa"
    keep.write_bytes(b"k")
    other = tmp_path / "spark-4.3.0-bbb.jsa"
    other.write_bytes(b"o")
    if source is not None:
        (tmp_path / ("spark-4.3.0-bbb.jsa" + CLASS_ARCHIVE_SOURCE)).write_text(str(tmp_path / source) + "\n")
    unrelated = tmp_path / "notes.jsa"
    unrelated.write_bytes(b"n")
    got = prune_archives(str(tmp_path), str(keep))
    assert got == ([str(other)] if removed else [])
    assert other.exists() is not removed and keep.exists() and unrelated.exists()
    assert (tmp_path / ("spark-4.3.0-bbb.jsa" + CLASS_ARCHIVE_SOURCE)).exists() is (source == "live")


@pytest.mark.parametrize("exists, refusals, want", [
    (True, "/tmp/r.log", " -Xlog:cds+dynamic=warning:file=/tmp/r.log::filecount=0"),
    (True, None, ""),
    (False, "/tmp/r.log", ""),  # recording: nothing to refuse
    (True, "/my tmp/r.log", ""),  # a path with spaces is not passed through -Xlog
])
def test_class_archive_flags_log_a_refusal_to_a_file_when_mapping(exists, refusals, want):
    from dledger_spark.session import class_archive_flags

    base = class_archive_flags("/c/a.jsa", exists)
    assert class_archive_flags("/c/a.jsa", exists, refusals) == base + want


@pytest.mark.parametrize("env_path, refused, removed", [
    (False, True, True),    # the cache's archive, refused: removed, the next --once records one
    (True, True, False),    # the operator's own path: only reported
    (False, False, False),  # mapped: nothing to do
])
def test_check_refusal_removes_a_refused_cache_archive(tmp_path, env_path, refused, removed):
    from dledger_spark.session import CLASS_ARCHIVE_ENV, CLASS_ARCHIVE_SOURCE, check_refusal

    archive = tmp_path / "spark-4.3.0-abc.jsa"
    archive.write_bytes(b"a")
    (tmp_path / ("spark-4.3.0-abc.jsa" + CLASS_ARCHIVE_SOURCE)).write_text("/x\n")
    log = tmp_path / "r.log"
    log.write_text(f"[0.4s][warning][cds,dynamic] Unable to use shared archive. The top archive failed to load: "
                   f"{archive}\n" if refused else "")
    env = {CLASS_ARCHIVE_ENV: str(archive)} if env_path else {}
    assert check_refusal(str(archive), str(log), env) is refused
    assert archive.exists() is not removed and not log.exists()
    assert (tmp_path / ("spark-4.3.0-abc.jsa" + CLASS_ARCHIVE_SOURCE)).exists() is not removed
    assert check_refusal(str(archive), str(tmp_path / "missing.log"), env) is False



def test_stop_session_notes_a_cache_archive_and_prunes_dead_ones(tmp_path, monkeypatch):
    """A recorded archive kept in the cache gets its jars directory noted beside it, and the cache's dead
    archives (here one without a note, as every archive before Round 2f) go, ~180 MB each."""
    import os

    import pyspark
    from dledger_spark import session

    monkeypatch.delenv("DLEDGER_SPARK_CLASS_ARCHIVE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path, exists = session._class_archive(record=True)
    final = session.class_archive_path()
    assert not exists and path == f"{final}.{os.getpid()}.tmp"
    dead = tmp_path / "dledger-spark" / "spark-4.3.0-000000000000.jsa"
    dead.write_bytes(b"old")
    _proc, spark = _stand_in_jvm(monkeypatch, path, 0)
    session.stop_session(spark, timeout=30)
    assert os.path.exists(final) and not dead.exists()
    with open(final + session.CLASS_ARCHIVE_SOURCE) as f:
        assert f.read().strip() == os.path.realpath(os.path.join(os.path.dirname(pyspark.__file__), "jars"))
    session._recording = None
