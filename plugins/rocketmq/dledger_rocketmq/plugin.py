"""The pluggy plugin module registered in the ``dledger`` entry-point group.

It implements no hooks yet: the broker service, its options, the append
hook that writes physical offsets and the commit listener that dispatches
consume queues need dledger's plugin API to grow first (issue #10).  Being
registered already proves the packaging: ``dledger plugins`` lists it.
"""

from __future__ import annotations
