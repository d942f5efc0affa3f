"""The bulk read path: binary GET replies for dledger clients, and committed reads served by followers."""

import json

import pytest
from twisted.internet.testing import MemoryReactorClock, StringTransport
from zope.interface import implementer

from dledger.codes import ResponseCode
from dledger.entry import Entry
from dledger.errors import DLedgerError
from dledger.interfaces import IRequestHandler
from dledger.messages import GetEntriesRequest, GetEntriesResponse
from dledger.reads import committed_read_error
from dledger.testing import Cluster
from dledger.transport import remoting
from dledger.transport.protocol import RemotingServerFactory

ENTRIES = [Entry(b"x" * n, index=i, term=2, pos=i * 100, body_crc=0).sealed() for i, n in enumerate((0, 1, 1024))]
JAVA_ENTRY = Entry(b"java", index=3, term=2, pos=300)  # bodyCrc 0: written by Java, unverified


def test_binary_get_reply_round_trips_entries_and_fields():
    """encode_get_reply_binary / decode_get_reply_binary keep every entry field and the reply's base fields."""
    resp = GetEntriesResponse(group="g0", leader_id="n1", term=7, entries=[*ENTRIES, JAVA_ENTRY])
    back = remoting.decode_get_reply_binary(remoting.encode_get_reply_binary(resp))
    assert back == resp


def test_binary_get_reply_is_smaller_than_json_for_large_bodies():
    """A reply of 1 KiB bodies carries them raw: no Base64 (at least 20 % smaller than the JSON body)."""
    resp = GetEntriesResponse(group="g0", entries=[Entry(bytes(1024), index=i, term=1, pos=i * 1072).sealed()
                                                   for i in range(100)])
    assert len(remoting.encode_get_reply_binary(resp)) < 0.8 * len(remoting.encode_body(resp))


@pytest.mark.parametrize("damage, error", [
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "crc32c"),            # a flipped body bit: section CRC
    (lambda b: b[:6] + b"\x00\x00\x00\x63" + b[10:], "announces 99"),  # count 99, bytes hold 3
    (lambda b: b"\x02" + b[1:], "version"),
    (lambda b: b[:1] + b"\x01" + b[2:], "flags"),
])
def test_damaged_binary_get_reply_is_refused(damage, error):
    """A damaged binary GET reply raises BinaryBodyError naming what is wrong, never returns entries."""
    body = remoting.encode_get_reply_binary(GetEntriesResponse(group="g0", entries=ENTRIES))
    with pytest.raises(remoting.BinaryBodyError, match=error):
        remoting.decode_get_reply_binary(damage(body))


def test_binary_get_request_keeps_the_json_body_and_asks_for_a_binary_reply():
    """A binary GET request is the JSON request plus extFields dledger.reply=bin (a Java member reads it as JSON)."""
    req = GetEntriesRequest(group="g0", remote_id="n0", begin_index=5, max_size=10)
    plain = remoting.decode_frame(remoting.encode_request(req, 1))
    marked = remoting.decode_frame(remoting.encode_request(req, 1, binary=True))
    assert marked.body == plain.body
    assert marked.header.ext_fields == {"dledger.reply": "bin"} and plain.header.ext_fields is None
    assert marked.header.body_encoding is None and marked.header.reply_encoding == "bin"
    assert remoting.decode_request(marked) == req


def test_follower_read_flag_is_a_json_extension_field():
    """followerRead travels as a JSON key Java ignores; absent unless set."""
    body = json.loads(remoting.encode_body(GetEntriesRequest(group="g0", begin_index=1, follower_read=True)))
    assert body["followerRead"] is True
    assert "followerRead" not in json.loads(remoting.encode_body(GetEntriesRequest(group="g0")))


@implementer(IRequestHandler)
class Entries:
    """Answers GETs from below 10 with ENTRIES, anything else with INDEX_OUT_OF_RANGE."""

    def handle_request(self, request):
        if isinstance(request, GetEntriesRequest) and request.begin_index < 10:
            return GetEntriesResponse(group=request.group, entries=list(ENTRIES))
        raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE, "past the end", leader_id="n1")


def serve(frame: bytes):
    proto = RemotingServerFactory(MemoryReactorClock(), Entries()).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    proto.dataReceived(frame)
    [reply] = remoting.split_frames(transport.value())
    return reply


def test_member_answers_a_marked_get_with_a_binary_reply_and_others_with_json():
    """The serving protocol writes a binary reply body only to a GET that asked for one; both decode the same."""
    req = GetEntriesRequest(group="g0", remote_id="n0", begin_index=0, max_size=3)
    binary = serve(remoting.encode_request(req, 7, binary=True))
    plain = serve(remoting.encode_request(req, 8))
    assert binary.header.body_encoding == "bin" and binary.header.opaque == 7
    assert plain.header.body_encoding is None and plain.body == remoting.encode_body(
        GetEntriesResponse(group="g0", entries=list(ENTRIES)))
    assert remoting.decode_response(binary, GetEntriesResponse).entries == ENTRIES
    assert remoting.decode_response(plain, GetEntriesResponse).entries == ENTRIES


def test_error_reply_to_a_binary_get_stays_json():
    """A refused GET is answered with Java's JSON error body (its code, leaderId), even when binary was asked for."""
    req = GetEntriesRequest(group="g0", remote_id="n0", begin_index=99, max_size=3)
    reply = serve(remoting.encode_request(req, 3, binary=True))
    assert reply.header.body_encoding is None
    resp = remoting.decode_response(reply, GetEntriesResponse)
    assert resp.response_code is ResponseCode.INDEX_OUT_OF_RANGE and resp.leader_id == "n1"


@pytest.mark.parametrize("begin, ledger_begin, committed, code", [
    (5, 0, 10, None),
    (10, 0, 10, None),                                   # the committed index itself
    (11, 0, 10, ResponseCode.INDEX_OUT_OF_RANGE),        # past what this member knows is committed
    (0, 0, -1, ResponseCode.INDEX_OUT_OF_RANGE),         # nothing committed yet
    (3, 4, 10, ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN),  # deleted by retention
])
def test_committed_read_error_table(begin, ledger_begin, committed, code):
    """A member serves a committed read exactly from its begin index up to its own committed index."""
    error = committed_read_error(begin, ledger_begin, committed, "n1")
    assert (error and error.code) == code


def test_follower_serves_committed_entries_only_when_asked_and_never_past_its_commit():
    """followerRead: a follower answers from its committed prefix; without it NOT_LEADER; past it INDEX_OUT_OF_RANGE."""
    cluster = Cluster(3, seed=4)
    cluster.start()
    leader = cluster.append_committed([b"e%d" % i for i in range(20)])
    follower = next(mid for mid in cluster.ids if mid != leader)
    server = cluster.servers[follower]
    committed = server.store.committed_index
    got = server.handle_get(GetEntriesRequest(group="g0", remote_id=follower, begin_index=0, max_size=100,
                                              follower_read=True))
    assert sorted(e.body for e in got.entries) == sorted(b"e%d" % i for i in range(20))
    assert all(e.index <= committed for e in got.entries)
    assert got.entries == [e for e in cluster.committed_entries(leader) if not e.is_noop]
    with pytest.raises(DLedgerError) as refused:
        server.handle_get(GetEntriesRequest(group="g0", remote_id=follower, begin_index=0, max_size=1))
    assert refused.value.code is ResponseCode.NOT_LEADER
    with pytest.raises(DLedgerError) as past:
        server.handle_get(GetEntriesRequest(group="g0", remote_id=follower, begin_index=committed + 1,
                                            follower_read=True))
    assert past.value.code is ResponseCode.INDEX_OUT_OF_RANGE and past.value.leader_id == leader
    cluster.stop()


def test_client_get_from_a_member_reads_the_follower():
    """DLedgerClient.get(member=) sends a followerRead GET to that member and raises its refusal."""
    cluster = Cluster(3, seed=5)
    cluster.start()
    leader = cluster.append_committed([b"a", b"b"])
    follower = next(mid for mid in cluster.ids if mid != leader)
    client = cluster.client()
    d = client.get(0, 10, member=follower)
    cluster.run_until(lambda: d.called, 5)
    assert sorted(e.body for e in d.result) == [b"a", b"b"]
    end = cluster.servers[follower].store.committed_index
    d = client.get(end + 1, 10, member=follower)
    cluster.run_until(lambda: d.called, 5)
    failure = []
    d.addErrback(failure.append)
    assert failure and failure[0].value.code is ResponseCode.INDEX_OUT_OF_RANGE
    cluster.stop()


def test_client_gets_ask_for_binary_and_read_json_replies_from_java():
    """RemoteTransport marks GETs; a JSON reply (a Java member) is read; a remoting error gets the GET again in JSON."""
    from test_transport_tcp import Echo, Net, result_of

    from dledger.client import RemoteTransport

    net = Net(Echo())
    client = RemoteTransport(net.reactor, {"n0": "127.0.0.1:20911"})
    request = GetEntriesRequest(group="g0", remote_id="n0", begin_index=1, max_size=5)
    d = client.send("n0", request)
    pump = net.completer.succeedOnce(greet=False)
    sent = remoting.decode_frame(pump.clientIO.getOutBuffer())
    assert sent.header.reply_encoding == "bin" and remoting.decode_request(sent) == request
    java_reply = GetEntriesResponse(group="g0", entries=[JAVA_ENTRY])
    pump.clientIO.bufferReceived(remoting.encode_response(java_reply, sent.header.opaque))  # JSON, unmarked
    assert result_of(d).entries == [JAVA_ENTRY] and client.binary_refused == set()
    d = client.send("n0", request)
    sent = remoting.decode_frame(pump.clientIO.getOutBuffer())
    pump.clientIO.bufferReceived(remoting.encode_frame(remoting.Header(1, sent.header.opaque, 1, remark="no")))
    again = remoting.decode_frame(pump.clientIO.getOutBuffer())
    assert again.header.ext_fields is None and remoting.decode_request(again) == request
    pump.clientIO.bufferReceived(remoting.encode_reply(again.header.opaque, remoting.encode_get_reply_binary(
        java_reply), binary=True))
    assert result_of(d).entries == [JAVA_ENTRY] and client.binary_refused == {"127.0.0.1:20911"}


def test_raw_get_is_the_same_get_on_the_wire_and_keeps_the_binary_reply_as_bytes():
    """DLedgerClient.get_raw's request: a GET marked for a binary reply, the same frame as get's; its binary reply
    comes back undecoded (section, count; section CRC checked), a JSON reply with its entries decoded."""
    from test_transport_tcp import Echo, Net, result_of

    from dledger.client import RemoteTransport
    from dledger.messages import GetEntriesRawRequest, GetEntriesRawResponse

    net = Net(Echo())
    client = RemoteTransport(net.reactor, {"n0": "127.0.0.1:20911"})
    request = GetEntriesRawRequest(group="g0", remote_id="n0", begin_index=0, max_size=5)
    d = client.send("n0", request)
    pump = net.completer.succeedOnce(greet=False)
    sent = remoting.decode_frame(pump.clientIO.getOutBuffer())
    plain = GetEntriesRequest(group="g0", remote_id="n0", begin_index=0, max_size=5)
    assert sent.header.code == 50002 and sent.header.reply_encoding == "bin"
    assert remoting.decode_request(sent) == plain
    assert remoting.encode_request(request, 7, binary=True) == remoting.encode_request(plain, 7, binary=True)
    body = remoting.encode_get_reply_binary(GetEntriesResponse(group="g0", entries=ENTRIES))
    pump.clientIO.bufferReceived(remoting.encode_reply(sent.header.opaque, body, binary=True))
    got = result_of(d)
    assert isinstance(got, GetEntriesRawResponse) and got.count == len(ENTRIES) and got.entries == []
    assert bytes(got.section) == body[-len(got.section):] and len(got.section) == sum(e.size for e in ENTRIES)
    d = client.send("n0", request)
    sent = remoting.decode_frame(pump.clientIO.getOutBuffer())
    pump.clientIO.bufferReceived(remoting.encode_response(GetEntriesResponse(group="g0", entries=[JAVA_ENTRY]),
                                                          sent.header.opaque))
    got = result_of(d)
    assert isinstance(got, GetEntriesRawResponse) and got.section is None and got.entries == [JAVA_ENTRY]


def test_raw_get_through_an_in_process_cluster_reads_the_entries():
    """get_raw over dledger.testing's in-process transport: the member serves it as a GET (no UNSUPPORTED)."""
    cluster = Cluster(3, seed=6)
    cluster.start()
    cluster.append_committed([b"a", b"b"])
    d = cluster.client().get_raw(0, 10)
    cluster.run_until(lambda: d.called, 5)
    assert [e.body for e in d.result.entries] == [b"a", b"b"]
    cluster.stop()
