"""``python -m dispatch_service.offline.training``."""

import sys

from dispatch_service.offline.training.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
