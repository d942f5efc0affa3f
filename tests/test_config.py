"""Configuration: DLedger option names and defaults, TOML files, and precise errors."""

import pytest

from dledger.config import PRESETS, DLedgerConfig, make_config, parse_peers
from dledger.errors import ConfigError

PEERS = "n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913"


def test_defaults_are_dledgers():
    """Defaults match Java DLedger 0.3.2's where the option exists."""
    c = DLedgerConfig()
    assert (c.heart_beat_time_interval_ms, c.max_heart_beat_leak) == (2000, 3)
    assert (c.min_vote_interval_ms, c.max_vote_interval_ms) == (300, 1000)
    assert (c.max_pending_requests_num, c.max_wait_ack_time_ms) == (10000, 2500)
    assert (c.file_reserved_hours, c.delete_when) == (72, "04")
    assert c.mapped_file_size_for_entry_data == 1 << 30
    assert c.mapped_file_size_for_entry_index == 5242880 * 32
    assert c.flush_policy == "sync"


def test_peers_parse_in_order():
    """Peers parse into an ordered id -> Peer map; host names may contain dashes."""
    peers = parse_peers("n0-127.0.0.1:20911;n1-my-host.local:20912;n2-[::1]:20913")
    assert list(peers) == ["n0", "n1", "n2"]
    assert peers["n1"].host == "my-host.local" and peers["n1"].port == 20912
    assert peers["n2"].host == "::1" and peers["n2"].address == "[::1]:20913"
    assert str(peers["n0"]) == "n0-127.0.0.1:20911"


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("   ", "empty"),
    ("n0-127.0.0.1:20911;", "stray ';'"),
    (";n0-127.0.0.1:20911", "stray ';'"),
    ("n0-127.0.0.1:20911;;n1-127.0.0.1:1", "stray ';'"),
    ("n0127.0.0.1:20911", "no '-'"),
    ("-127.0.0.1:20911", "empty member id"),
    ("n0-127.0.0.1", "no ':port'"),
    ("n0-:20911", "empty host"),
    ("n0-127.0.0.1:port", "not a number"),
    ("n0-127.0.0.1:0", "out of range"),
    ("n0-127.0.0.1:70000", "out of range"),
    ("n0-127.0.0.1:1;n0-127.0.0.1:2", "duplicate member id 'n0'"),
    ("n 0-127.0.0.1:1", "may only contain"),
    ("n0-[::1:20911", "IPv6"),
])
def test_peers_errors_are_precise(text, message):
    """Every malformed peers string is refused with a message naming the problem."""
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_peers(text)


def test_self_id_must_be_a_peer():
    """selfId not among the peers is refused, listing the peers."""
    with pytest.raises(ConfigError, match="selfId: 'n9' is not one of the peers"):
        DLedgerConfig(self_id="n9", peers=PEERS)


@pytest.mark.parametrize("options, message", [
    ({"min_vote_interval_ms": 2000}, "minVoteIntervalMs"),
    ({"heart_beat_time_interval_ms": 0}, "heartBeatTimeIntervalMs: must be > 0"),
    ({"mapped_file_size_for_entry_index": 100}, "multiple of the 32-byte"),
    ({"flush_policy": "sometimes"}, "flushPolicy"),
    ({"delete_when": "25"}, "deleteWhen"),
    ({"disk_full_ratio": 1.5}, "diskFullRatio"),
    ({"preferred_leader_ids": "n7"}, "preferredLeaderIds"),
    ({"max_heart_beat_leak": "three"}, "expected an integer"),
    ({"enable_batch_push": "maybe"}, "expected true or false"),
    ({"enable_batch_push": "true"}, "expected true or false"),
    ({"check_point_interval": "500"}, "expected an integer"),
    ({"max_in_flight_full_pushes": 0}, "maxInFlightFullPushes: must be > 0"),
    ({"switch_interval_ms": 0}, "switchIntervalMs: must be > 0 and <= 1000 ms"),
    ({"switch_interval_ms": 5000}, "switchIntervalMs: must be > 0 and <= 1000 ms"),
    ({"switch_interval_ms": "1"}, "switchIntervalMs: expected a number"),
])
def test_invalid_values_are_refused(options, message):
    """Out-of-range or mistyped values raise ConfigError naming the option."""
    with pytest.raises(ConfigError, match=message):
        DLedgerConfig(peers=PEERS, **options)


@pytest.mark.parametrize("toml, message", [
    ('heartBeatTimeIntervalMs = "100"', "heartBeatTimeIntervalMs: expected an integer (unquoted), got '100'"),
    ('enableBatchPush = "yes"', "enableBatchPush: expected true or false (a TOML boolean, unquoted), got 'yes'"),
    ('enableBatchPush = 1', "enableBatchPush: expected true or false"),
    ('diskFullRatio = "0.9"', "diskFullRatio: expected a number (unquoted), got '0.9'"),
    ('maxHeartBeatLeak = 2.5', "maxHeartBeatLeak: expected an integer"),
    ('maxFrameSize = 10', "maxFrameSize: must be at least 65536 bytes"),
    ('maxEntrySize = 20971520', "maxEntrySize: 20971520 does not fit in a frame of maxFrameSize 16777216"),
    ('maxFrameSize = 1048576', "maxEntrySize: 4194304 does not fit in a frame of maxFrameSize 1048576"),
    ('storeBaseDir = ""', "storeBaseDir: must not be empty"),
    ('storeType = " "', "storeType: must not be empty"),
])
def test_config_file_values_are_checked_as_documented(tmp_path, toml, message):
    """A TOML value of the wrong type or out of its range is refused with the option's name and what it expects."""
    path = tmp_path / "m.toml"
    path.write_text(f'peers = "{PEERS}"\n{toml}\n')
    with pytest.raises(ConfigError) as info:
        make_config(file=path)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_entry_size_and_frame_size_that_fit_are_accepted():
    """maxEntrySize up to what fits in one maxFrameSize frame (Base64 plus header) is accepted, one more is not."""
    from dledger.config import max_entry_size_for_frame

    limit = max_entry_size_for_frame(1 << 20)
    assert make_config(peers=PEERS, maxFrameSize=1 << 20, maxEntrySize=limit).max_entry_size == limit
    with pytest.raises(ConfigError, match="maxEntrySize"):
        make_config(peers=PEERS, maxFrameSize=1 << 20, maxEntrySize=limit + 1)


@pytest.mark.parametrize("push, frame, expected", [
    (1 << 20, 16 << 20, 1 << 20),                                   # the defaults: the push size as set
    (1 << 20, 1 << 20, (1024 - 64) * 1024 * 3 // 4),                # a 1 MiB frame: what fits it in Base64
    (256 * 1024, 1 << 20, 256 * 1024),                              # a smaller push is kept
    (1 << 20, 64 * 1024, 1),                                        # the smallest frame: one entry per push
])
def test_push_budget(push, frame, expected):
    from dledger.config import push_budget

    assert push_budget(push, frame) == expected


@pytest.mark.parametrize("frame", [1 << 20, 2 << 20, 16 << 20])
def test_a_push_of_the_budget_fits_its_frame_in_both_forms(frame):
    """A leader's push of push_budget bytes of 1 KiB entries travels in one frame, binary or JSON (to Java)."""
    from dledger.codes import PushType
    from dledger.config import push_budget
    from dledger.entry import HEADER_SIZE, Entry
    from dledger.messages import PushEntryRequest
    from dledger.transport import remoting

    budget = push_budget(1 << 20, frame)
    count = budget // (HEADER_SIZE + 1024)
    batch = [Entry(bytes(1024), i, 1, i * (HEADER_SIZE + 1024)).sealed() for i in range(count)]
    push = PushEntryRequest(group="g0", remote_id="n1", local_id="n0", leader_id="n0", term=1, commit_index=0,
                            type=PushType.APPEND, batch_entry=batch, total_size=sum(e.size for e in batch))
    for binary in (True, False):
        assert len(remoting.encode_request(push, 1, binary=binary)) <= frame, binary


def test_camel_case_and_snake_case_overrides():
    """Overrides accept DLedger's camelCase names and snake_case, and refuse unknown ones with a hint."""
    c = make_config(peers=PEERS, selfId="n1", heartBeatTimeIntervalMs=500, max_vote_interval_ms=900)
    assert (c.self_id, c.heart_beat_time_interval_ms, c.max_vote_interval_ms) == ("n1", 500, 900)
    assert c.quorum == 2 and c.self_peer.port == 20912
    with pytest.raises(ConfigError, match="did you mean 'heartBeatTimeIntervalMs'"):
        make_config(peers=PEERS, heartBeatTimeIntervalMS=1)
    with pytest.raises(ConfigError, match="given twice"):
        make_config(peers=PEERS, selfId="n0", self_id="n1")


def test_fast_preset():
    """The fast preset shortens timers; explicit options still win."""
    c = make_config(preset="fast", peers=PEERS)
    assert c.heart_beat_time_interval_ms == PRESETS["fast"]["heart_beat_time_interval_ms"] == 100
    assert make_config(preset="fast", peers=PEERS, heartBeatTimeIntervalMs=250).heart_beat_time_interval_ms == 250
    with pytest.raises(ConfigError, match="preset"):
        make_config(preset="turbo")


def test_toml_file(tmp_path):
    """A TOML file sets options (camelCase), a preset and plugin extras; overrides beat the file."""
    path = tmp_path / "m.toml"
    path.write_text(f'preset = "fast"\ngroup = "g0"\nselfId = "n2"\npeers = "{PEERS}"\n'
                    'storeType = "mmap"\nmaxVoteIntervalMs = 400\n[plugins]\nbroker_name = "b0"\n')
    c = make_config(file=path, storeBaseDir=str(tmp_path))
    assert (c.group, c.self_id, c.store_type, c.max_vote_interval_ms) == ("g0", "n2", "mmap", 400)
    assert c.heart_beat_time_interval_ms == 100
    assert c.extras == {"broker_name": "b0"}
    assert c.member_dir == tmp_path / "dledger-n2"


def test_toml_errors_name_the_file(tmp_path):
    """Missing files, bad TOML and unknown keys are reported with the file name."""
    with pytest.raises(ConfigError, match="does not exist"):
        make_config(file=tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("peers = \n")
    with pytest.raises(ConfigError, match="bad.toml"):
        make_config(file=bad)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('heartbeat = 5\n')
    with pytest.raises(ConfigError, match="unknown option 'heartbeat'"):
        make_config(file=unknown)


def test_sample_config_is_valid():
    """etc/dledger.toml, the commented sample, loads and validates."""
    from pathlib import Path
    sample = Path(__file__).parent.parent / "etc" / "dledger.toml"
    c = make_config(file=sample)
    assert len(c.members) == 3 and c.self_id in c.members


def test_to_dict_round_trips():
    """to_dict() gives camelCase options that rebuild an equal config."""
    c = make_config(peers=PEERS, selfId="n1")
    assert make_config(**c.to_dict()) == c


def test_every_option_is_documented():
    """Each option appears in docs/configuration.md under its camelCase name."""
    import dataclasses
    from pathlib import Path

    from dledger.config import _camel
    doc = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    for f in dataclasses.fields(DLedgerConfig):
        if f.name != "extras":
            assert f"`{_camel(f.name)}`" in doc, f.name


@pytest.mark.parametrize("options, message", [
    ({"snapshot_threshold": -1}, "snapshotThreshold: must be >= 0"),
    ({"snapshot_threshold_bytes": -5}, "snapshotThresholdBytes: must be >= 0"),
    ({"trailing_entries": -1}, "trailingEntries: must be >= 0"),
    ({"max_snapshot_reserved_num": 0}, "maxSnapshotReservedNum: must be >= 1"),
    ({"snapshot_file_size": 100}, "snapshotFileSize: must be at least 4096"),
    ({"snapshot_chunk_size": 10}, "snapshotChunkSize: must be between 1024 and"),
    ({"snapshot_chunk_size": 64 << 20}, "snapshotChunkSize: must be between 1024 and"),
])
def test_snapshot_options_are_checked(options, message):
    """Snapshot options out of range are one-line ConfigErrors naming the option."""
    with pytest.raises(ConfigError, match=message) as info:
        make_config(**options)
    assert "\n" not in str(info.value)
