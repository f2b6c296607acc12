"""``python -m poolgate.gateway.sibling``: one sibling gateway process of ``--gateway-processes N``.

The parent (``gateway.scale_out``) writes its ``SiblingStart`` pickled to
stdin (the parent alone can, so unpickling it is no risk); the sibling asks
the kernel for SIGTERM when the parent dies (``shared.parent_death``), then
serves as the parent does (``gateway.launch.run_gateway``) on the same port,
with the processes' shared folder for metrics and tenant quotas.
"""

from __future__ import annotations

import logging
import pickle
import sys

from poolgate.gateway.launch import run_gateway
from poolgate.gateway.scale_out import Share, SiblingStart
from poolgate.shared.parent_death import die_with_parent


def main() -> int:
    start = pickle.load(sys.stdin.buffer)
    if not isinstance(start, SiblingStart):
        sys.exit("poolgate.gateway.sibling is started by poolgate serve --gateway-processes N")
    die_with_parent(start.parent_pid)
    logging.basicConfig(
        level=start.log_level, format=f"%(asctime)s %(levelname)s %(name)s [process {start.index}]: %(message)s"
    )
    return run_gateway(start.config, Share(start.folder, parent=False))


if __name__ == "__main__":
    sys.exit(main())
