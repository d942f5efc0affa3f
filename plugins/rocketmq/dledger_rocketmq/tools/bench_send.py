"""The broker port's per-send work without the log: ``python -m dledger_rocketmq.tools.bench_send [--calls N]``.

Times (min of 7 rounds of ``--calls`` calls, microseconds per call) the three
steps of a SEND_MESSAGE_V2 from a Java client that the broker layer does on
the master's reactor besides the put: the JSON header decoded
(:func:`~dledger_rocketmq.port.decode_json_header`), the send header read by
the two handlers that look at it (the transaction check and the send), and
the reply frame of a successful send.  Run it with another tree first on
``PYTHONPATH`` to compare (docs/benchmarks.md, "Broker layer (perf-broker)").
"""

from __future__ import annotations

import argparse
import timeit

from dledger_rocketmq.broker.port import Request, decode_json_header, reply_frame, send_args, send_reply
from dledger_rocketmq.store.commitlog import PutResult, PutStatus

#: A SEND_MESSAGE_V2 header as the stock 4.9.8 producer writes it (13 extFields, all strings).
JAVA_HEADER = (b'{"code":310,"extFields":{"a":"bench_java_pg","b":"BenchTopic","c":"TBW102","d":"8","e":"3","f":"0",'
               b'"g":"1764258000000","h":"0","i":"TAGS\\u0001TagA\\u0002UNIQ_KEY\\u00017F0000010000","j":"0",'
               b'"k":"false","m":"false","n":"RaftNode00"},"flag":0,"language":"JAVA","opaque":12345,'
               b'"serializeTypeCurrentRPC":"JSON","version":399}')
MSG_ID = "7F00000100002A9F0000000000000000"


def run(calls: int = 20_000) -> dict[str, float]:
    header = decode_json_header(JAVA_HEADER)
    result = PutResult(PutStatus.PUT_OK, msg_id=MSG_ID, queue_id=3, queue_offset=12, msg_ids=(MSG_ID,), count=1)

    def send_header():
        if hasattr(Request, "sending"):  # decoded once, read twice
            req = Request(310, header.ext_fields)
            return req.sending, req.sending
        return send_args(310, header.ext_fields), send_args(310, header.ext_fields)  # older trees: twice

    def per_call(fn) -> float:
        return round(min(timeit.repeat(fn, number=calls, repeat=7)) / calls * 1e6, 2)
    return {"decode_json_header_us": per_call(lambda: decode_json_header(JAVA_HEADER)),
            "send_header_us": per_call(send_header),
            "send_reply_frame_us": per_call(lambda: reply_frame(header, send_reply(result)))}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dledger_rocketmq.tools.bench_send",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=20_000, help="calls per round (default 20000)")
    args = p.parse_args(argv)
    print(", ".join(f"{k} {v}" for k, v in run(max(1, args.calls)).items()))


if __name__ == "__main__":
    main()
