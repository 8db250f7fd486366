"""Worker process of :mod:`opfuse.backends.gpu.lower.nvptx`: JSON request on stdin, JSON reply on stdout.

Lowering runs here so that an LLVM fatal error (which aborts the process) cannot take the
compiler down with it; the parent turns a dead worker into an OpfuseError with reproducers.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from opfuse.backends.gpu.lower.nvptx import run_request

    request = json.load(sys.stdin)
    json.dump(run_request(request), sys.stdout)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
