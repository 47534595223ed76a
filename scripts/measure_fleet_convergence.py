"""Measure a local fleet's convergence: three launchers on one state store, under steady load.

Uses the fleet of the integration test (`tests/integration/test_fleet.py`: launchers on free
loopback ports over one signed copy of the model repository). Per trial it prints the
seconds from `dispatch-admin deploy --canary-percent 10` writing the document until every
replica reports the new revision (``/healthz`` field ``fleet_state``), whether canary users
get the canary version on every replica and entry point, the same for a rollback
(`--unload-canary`), the requests sent meanwhile and how many failed, and each replica's
`fleet_state_applied` phases. Everything runs on this host: on a 2-core machine the three
replicas and the load share the cores.

    .venv/bin/python scripts/measure_fleet_convergence.py [--trials N] [--replicas N]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

import test_fleet as fleet_test
from launcher_helpers import signed_repository

CANARY, STABLE = 2, 1


def trial(replicas: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="fleet-convergence-"))
    repository, trusted, key = signed_repository(root)
    fleet = fleet_test.Fleet(root, repository, trusted, key, root / "store")
    try:
        started = time.monotonic()
        fleet.start(replicas)
        print(f"{replicas} replicas ready in {time.monotonic() - started:.1f} s")
        for revision, command in enumerate(
            (
                ("deploy", "--version", str(CANARY), "--canary-percent", "10"),
                ("rollback", "--unload-canary"),
            ),
            start=1,
        ):
            with fleet_test.Load(fleet.live()) as load:
                time.sleep(1.0)
                code, text = fleet.write(*command)
                written = time.monotonic()
                assert code == 0, text
                fleet_test.until(
                    f"revision {revision}", lambda r=revision: fleet_test.serving(fleet, r)
                )
                seconds = time.monotonic() - written
                time.sleep(1.0)
            print(
                f"{command[0]}: every replica on revision {revision} {seconds:.1f} s after the "
                f"write; {load.sent} requests, {len(load.errors)} failed"
            )
            if command[0] == "deploy":
                canary, stable = fleet_test.sample_users(10)
                answers = [
                    fleet_test.versions_by_user(r, m, canary + stable)
                    for r in fleet.live()
                    for m in ("dispatch", "dispatch_fused")
                ]
                same = all(
                    {got[u] for u in canary} == {CANARY} and {got[u] for u in stable} == {STABLE}
                    for got in answers
                )
                print(f"  canary users on the canary on every replica and entry point: {same}")
        for n, replica in enumerate(fleet.replicas):
            for line in replica.lines:
                if '"fleet_state_applied"' in line:
                    event = json.loads(line)
                    print(f"  replica {n} revision {event['revision']}: {event['phases_s']}")
    finally:
        for replica in fleet.replicas:
            replica.launcher.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.trials):
        trial(args.replicas)


if __name__ == "__main__":
    main()
