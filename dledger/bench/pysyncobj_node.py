"""One PySyncObj node for ``dledger bench cluster --phases pysyncobj`` (run as a script, never imported).

    python pysyncobj_node.py ME PARTNERS JOURNAL node|driver DURATION WARMUP IN_FLIGHT SIZE

Every node replicates a counter; the driver also sends one-entry calls, ``IN_FLIGHT`` at once, and prints
``{"entries_per_s": ..., "errors": ..., "driver_was_leader": ...}`` as one JSON line.
"""
import json
import os
import queue
import signal
import sys
import time

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

me, partners, journal, role = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
duration, warmup, in_flight, size = float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])

class Log(SyncObj):
    def __init__(self):
        super().__init__(me, partners, SyncObjConf(journalFile=journal, dynamicMembershipChange=False))
        self.count = 0

    @replicated
    def append(self, body):
        self.count += 1
        return self.count

log = Log()
if role != "driver":
    signal.pause()
body = os.urandom(size)
log.append(body, sync=True, timeout=60)  # returns once a leader exists and committed it
start = time.monotonic()
measure_from, end = start + warmup, start + warmup + duration
st = {"acked": 0, "errors": 0, "outstanding": 0}
done = queue.Queue()

def callback(result, error):
    st["outstanding"] -= 1
    now = time.monotonic()
    if error == FAIL_REASON.SUCCESS:
        if measure_from <= now <= end:
            st["acked"] += 1
    else:
        st["errors"] += 1
    if now < end:
        st["outstanding"] += 1
        log.append(body, callback=callback)
    elif st["outstanding"] == 0:
        done.put(True)

for _ in range(in_flight):
    st["outstanding"] += 1
    log.append(body, callback=callback)
try:
    done.get(timeout=duration + warmup + 10)  # stragglers after the window do not count anyway
except queue.Empty:
    pass
print(json.dumps({"entries_per_s": st["acked"] / duration, "errors": st["errors"],
                  "driver_was_leader": log._getLeader() is not None and str(log._getLeader()) == me}), flush=True)
os._exit(0)
