"""Run a check as another local user: a forked child that drops to uid/gid 65534 (nobody).

Needs root to change uid; `needs_root` skips a test otherwise. The child runs ``action``
and sends back its JSON result through a pipe; it never returns into pytest.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest

OTHER_UID: Final = 65534

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="changing to a second uid (65534) needs root; CI runs as root"
)


def as_other_user(action: Callable[[], Any]) -> Any:
    """``action()`` as uid/gid 65534 in a forked child; its JSON result."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            result = json.dumps({"uid": os.geteuid(), "result": action()})
        except BaseException as exc:  # report it; the parent fails the test
            result = json.dumps({"uid": os.geteuid(), "error": repr(exc)})
            code = 1
        with os.fdopen(write_end, "w") as pipe:
            pipe.write(result)
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        report = json.loads(pipe.read() or "{}")
    os.waitpid(pid, 0)
    assert report.get("uid") == OTHER_UID and "error" not in report, report
    return report["result"]


def try_open(path: Path, flags: int) -> str:
    """ "opened", or the errno name of the refusal (e.g. EACCES, ENOENT, EEXIST)."""
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    os.close(fd)
    return "opened"
