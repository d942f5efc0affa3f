"""A dledger follower of a Java DLedger 0.3.2 leader: the recorded pushes of a Java leader, replayed, fill it."""

from pathlib import Path

import pytest
from twisted.internet import task

from dledger.codes import PushType, ResponseCode
from dledger.config import make_config
from dledger.messages import PushEntryRequest
from dledger.server import DLedgerServer
from dledger.transport import remoting
from dledger.transport.inprocess import InProcessNetwork

STREAMS = Path(__file__).parent / "golden" / "java-dledger-0.3.2" / "streams"


def recorded_requests(run: str, conn: str):
    """``[(arrival time, request)]`` the leader sent on ``conn`` (e.g. ``n0-n2.11``), timed by events.log."""
    label, number = conn.rsplit(".", 1)
    chunks = []
    for line in (STREAMS / run / "events.log").read_text().splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[1] == label and parts[2] == number and parts[3] == "c2s":
            chunks.append((float(parts[0]), int(parts[4]) + int(parts[5])))
    data = (STREAMS / run / f"{conn}.c2s.bin").read_bytes()
    out, end = [], 0
    for frame in remoting.split_frames(data):
        end += 8 + len(frame.header.to_json()) + len(frame.body)
        arrived = next(t for t, chunk_end in chunks if chunk_end >= end)
        out.append((arrived, remoting.decode_request(frame)))
    return out


def java_follower(tmp_path, clock, data_file_size, **options):
    """A fresh (empty) dledger member n2 of group g0 on an mmap store, as the Java runs configured it."""
    config = make_config(group="g0", self_id="n2", peers="n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3",
                         store_type="mmap", store_base_dir=str(tmp_path), transport_type="inprocess",
                         mapped_file_size_for_entry_data=data_file_size, mapped_file_size_for_entry_index=512,
                         enable_leader_elector=False, **options)
    server = DLedgerServer.build(config, clock=clock, transport=InProcessNetwork(clock).transport("n2"))
    server.start()
    return server


def replay(server, clock, requests):
    """Hand each recorded request to the member at its recorded time; the member's answers, by request."""
    answers = []
    start = requests[0][0]
    for arrived, request in requests:
        clock.advance(max(0.0, arrived - start - clock.seconds()))
        try:
            result = server.handle_request(request)
        except Exception as exc:  # an error answer, as the transport would send it
            answers.append((request, exc))
            continue
        if hasattr(result, "addBoth"):
            result.addBoth(lambda r, req=request: answers.append((req, r)))
        else:
            answers.append((request, result))
    clock.advance(5)
    return answers


def pushed_entries(requests):
    """Every entry the Java leader pushed (APPEND or TRUNCATE), by index; the last commit index it sent."""
    entries, commit = {}, -1
    for _, req in requests:
        if isinstance(req, PushEntryRequest):
            commit = max(commit, req.commit_index)
            if req.type in (PushType.APPEND, PushType.TRUNCATE):
                for e in req.entries():
                    entries[e.index] = e
    return entries, commit


@pytest.mark.parametrize("run, conn, data_file_size", [
    ("runF", "n0-n2.0", 4096),    # a new group: the vote for the Java leader, then its first entry
    ("runF", "n0-n2.11", 4096),   # wiped follower, idle leader, then two appends (non-batch pushes)
    ("runG2", "n1-n2.0", 3056),   # wiped follower caught up with one 20-entry batch push
])
def test_dledger_follower_catches_up_from_a_java_leader(tmp_path, run, conn, data_file_size):
    """Replaying a Java leader's recorded pushes (bodyCrc 0) to an empty dledger follower fills it by default."""
    clock = task.Clock()
    requests = recorded_requests(run, conn)
    entries, commit = pushed_entries(requests)
    assert entries and all(e.body_crc == 0 for e in entries.values()), "the recording holds Java's zero CRCs"
    server = java_follower(tmp_path, clock, data_file_size)
    try:
        answers = replay(server, clock, requests)
        store = server.store
        assert store.ledger_end_index == max(entries), [(type(q).__name__, getattr(q, "type", None),
                                                          getattr(a, "code", a)) for q, a in answers]
        held = [store.get(i) for i in range(store.ledger_begin_index, store.ledger_end_index + 1)]
        assert [(e.index, e.term, e.pos, e.magic, e.body) for e in held] == \
            [(e.index, e.term, e.pos, e.magic, e.body) for _, e in sorted(entries.items())]
        assert store.committed_index == commit
        refused = [a for _, a in answers if getattr(a, "code", None) == ResponseCode.UNEXPECTED_ARGUMENT]
        assert not refused
    finally:
        server.stop()


def test_zero_crc_refused_only_when_turned_off_with_a_clear_remark_and_one_log_line(tmp_path):
    """With acceptJavaZeroCrc = false the Java leader's entries get 411 with a remark naming the option, logged once."""
    from twisted.internet.testing import MemoryReactorClock, StringTransport
    from twisted.logger import globalLogPublisher

    from dledger.transport.protocol import RemotingServerFactory

    clock = task.Clock()
    server = java_follower(tmp_path, clock, 4096, accept_java_zero_crc=False)
    proto = RemotingServerFactory(MemoryReactorClock(), server).buildProtocol(None)
    wire = StringTransport()
    proto.makeConnection(wire)
    lines = []
    observer = lambda event: lines.append(event) if event.get("log_level").name == "error" else None
    globalLogPublisher.addObserver(observer)
    try:
        data = (STREAMS / "runF" / "n0-n2.11.c2s.bin").read_bytes()
        requests = recorded_requests("runF", "n0-n2.11")
        start = requests[0][0]
        frames = remoting.split_frames(data)
        for (arrived, _), frame in zip(requests, frames):
            clock.advance(max(0.0, arrived - start - clock.seconds()))
            proto.dataReceived(remoting.encode_frame(frame.header, frame.body))
        clock.advance(5)
    finally:
        globalLogPublisher.removeObserver(observer)
        server.stop()
    replies = remoting.split_frames(wire.value())
    sent = {f.header.opaque: remoting.decode_request(f) for f in frames}
    refused = [f for f in replies if isinstance(sent[f.header.opaque], PushEntryRequest)
               and b'"code":411' in f.body]
    assert refused, "the zero-CRC TRUNCATE/APPEND is refused"
    assert all(f.header.remark and "acceptJavaZeroCrc" in f.header.remark for f in refused)
    assert server.store.ledger_end_index == -1
    crc_lines = [e for e in lines if "acceptJavaZeroCrc" in str(e.get("why", ""))]
    assert len(crc_lines) == 1, "one rate-limited error line for repeated refusals"
