"""The campaign's receipt recovery consumer, a process of its own (docs/faults.md,
"The data flow"): ``python -m waymark.faults.consumer URL RECEIPTS CLIENT LOG``.

It subscribes to the source topic's changes with a ``RecoveryService`` and, for each
change (the missed ones first), appends ``key version`` to LOG and syncs it — its
"work" — before receipting it, as docs/recovery.md asks. So LOG is a superset of what
was receipted: a change it does not list was never receipted, and the recovery query
must report its key. A service that stopped (its server went away) is subscribed again.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import TextIO


def _process(out: TextIO, key: str, version: int) -> None:
    out.write(f"{key} {version}\n")
    out.flush()
    os.fsync(out.fileno())


def main(url: str, receipts: str, client: str, log: str, topic: str) -> None:
    from waymark.recovery import (
        CommittedVersion,
        LocalReceiptStore,
        RecoveryService,
        TopicCheckpoints,
        WindowLoss,
    )

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with open(log, "a") as out:  # a text log, appended and synced
        while not stop.is_set():
            service = RecoveryService(
                TopicCheckpoints(url, topics=[topic]), LocalReceiptStore(receipts), client
            )

            def on_change(c: CommittedVersion, service: RecoveryService = service) -> None:
                _process(out, c.key, c.version)
                service.submit_receipt(c)

            try:
                for c in service.subscribe(on_change):
                    if isinstance(c, WindowLoss):
                        print(f"window loss {c}", flush=True)
                        continue
                    _process(out, c.key, c.version)
                    service.submit_receipt(c)
                while not stop.wait(0.2) and service.failure is None:
                    pass
                if service.failure is not None:
                    print(f"service stopped: {service.failure}; subscribing again", flush=True)
            except Exception as e:  # the server is down: try again shortly
                print(f"subscribe failed: {type(e).__name__}: {e}", flush=True)
                stop.wait(0.5)
            finally:
                service.close()


if __name__ == "__main__":
    main(*sys.argv[1:6])
