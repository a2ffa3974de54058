"""A recovery client's status reports to a waymark server (docs/reports.md): its low
watermark, range receipts and pending checkpoints, every ``every_s`` seconds and at
once when the watermark moves, sent from a thread of its own so receipts never wait
for them. A report the server does not take is logged; the next one is tried."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..client import ApiError, Client, TransportError
from ..protocol import RecoveryReport
from .store import ReceiptStore
from .topicstore import TopicReceiptStore

log = logging.getLogger("waymark.recovery")


class StatusReporter:
    def __init__(
        self, client: Client, status: Callable[[], RecoveryReport | None], every_s: float
    ) -> None:
        self.client, self._status, self.every_s = client, status, every_s
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._loop, name="waymark-recovery-report",
                                        daemon=True)  # fmt: skip
        self.sent = 0  # reports the server took

    def start(self) -> None:
        if not self._thread.is_alive():
            self._thread.start()

    def poke(self) -> None:
        """Report soon, without waiting for the interval (the watermark moved)."""
        self._wake.set()

    def send(self) -> RecoveryReport | None:
        """Report now, from the calling thread; None when there is nothing to report."""
        report = self._status()
        if report is None:
            return None
        try:
            self.client.report_recovery(report)
        except (ApiError, TransportError) as exc:
            log.warning("recovery status report failed (the next one is tried): %s", exc)
            return None
        self.sent += 1
        return report

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            self.send()
            self._wake.wait(self.every_s)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def reporter_for(
    report_to: Client | str | None,
    store: ReceiptStore,
    status: Callable[[], RecoveryReport | None],
    every_s: float,
    report: bool,
) -> StatusReporter | None:
    """The reporter a service gets: to ``report_to``, by default to a
    :class:`TopicReceiptStore`'s own server, none with ``report=False``."""
    if not report:
        return None
    if report_to is None and isinstance(store, TopicReceiptStore):
        report_to = store.client
    if isinstance(report_to, str):
        report_to = Client(report_to)
    return None if report_to is None else StatusReporter(report_to, status, every_s)
