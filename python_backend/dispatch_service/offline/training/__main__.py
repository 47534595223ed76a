"""``python -m dispatch_service.offline.training``: pins the numerics, then runs the CLI.

The pinning must come before anything imports numpy (`training.numerics`), which is why the
package ``__init__`` loads its modules lazily.
"""

import os
import sys

from dispatch_service.offline.training.numerics import pin_this_process

__all__: list[str] = []

if __name__ == "__main__":
    unpinned = pin_this_process(os.environ)
    if unpinned is not None:
        print(f"training: not bit-reproducible here: {unpinned}", file=sys.stderr)
    from dispatch_service.offline.training.cli import main

    sys.exit(main())
