"""A Jepsen-style nemesis on real processes and a real (namespaced) network: docs/testing.md "Nemesis".

Why here and not in ``tools/``: the pieces are a library the project's own tests import (the process tests in
``tests/test_nemesis_process.py``, the table tests of the fault shapes and checkers), like the rest of
:mod:`dledger.testing`; ``python -m dledger.testing.nemesis`` is its command line.

* :mod:`.net` -- namespaces on a bridge, blackhole routes, clean-up;
* :mod:`.faults` -- fault kinds and seeded schedules (pure);
* :mod:`.members` -- member processes in namespaces, pauses, kills, libfaketime clocks;
* :mod:`.mutations` -- deliberately broken builds, reachable only from the harness;
* :mod:`.logload`, :mod:`.brokerload` -- workloads; :mod:`.logcheck`, :mod:`.brokercheck` -- their verdicts;
* :mod:`.runner` -- one run; :mod:`.cli` -- ``run``, ``long`` (``make nemesis``) and ``mutants``.
"""
