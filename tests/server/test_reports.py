"""Status reports of folds and recovery clients (docs/reports.md): report and read back
through the shipped client, staleness on the injected clock, refusals that store
nothing, durability across a SIGKILL, and the model of "newest report per reporter"."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.conftest import ServerProcess

from waymark.client import ApiError, AsyncClient, Client
from waymark.clock import ManualClock
from waymark.log import Engine
from waymark.protocol import (
    FoldExport,
    FoldReport,
    FoldRestore,
    FoldStopped,
    RecordIn,
    RecoveryReport,
)
from waymark.protocol.reports import STALE_INTERVALS
from waymark.server import App
from waymark.server import reports as reports_module
from waymark.server.reports import FOLDS_TOPIC, RECOVERY_TOPIC, Kept, ReportsApi

pytestmark = pytest.mark.timeout(60)


def fold(node: str = "n1", cursor: int = 5, bucket_seq: int = 9, **kw: object) -> FoldReport:
    return FoldReport("orders", node, "lmdb", "orders", cursor, bucket_seq, **kw)  # type: ignore[arg-type]


async def test_a_fold_report_reads_back_with_lag_and_export(client: AsyncClient) -> None:
    export = FoldExport(4, 1_700_000_000_000, "orders.payloads/5725ce14129a2dce.tar")
    status = await client.report_fold(fold(cursor=5, bucket_seq=9, export=export))
    assert (status.cursor, status.bucket_seq, status.lag, status.stale) == (5, 9, 4, False)
    await client.report_fold(fold("n2", cursor=9, bucket_seq=9, interval_ms=1000))
    folds = await client.list_folds()
    assert [(f.node, f.lag, f.export) for f in folds] == [("n1", 4, export), ("n2", 0, None)]
    assert [f.node for f in await client.get_fold("orders")] == ["n1", "n2"]
    with pytest.raises(ApiError) as refused:
        await client.get_fold("nobody")
    assert (refused.value.status, refused.value.code) == (404, "not_found")
    # A newer report of a node replaces its older one.
    await client.report_fold(fold(cursor=9, bucket_seq=12))
    assert [(f.node, f.cursor, f.lag) for f in await client.get_fold("orders")] == [
        ("n1", 9, 3), ("n2", 9, 0)]  # fmt: skip


async def test_a_fold_report_carries_its_export_role_and_its_bootstrap(
    client: AsyncClient,
) -> None:
    restore = FoldRestore("0123456789abcdef", 4, "verify", 1024, 4096)
    await client.report_fold(fold(role="standby", lease_holder="n2", restore=restore))
    await client.report_fold(fold("n2", role="exporter", lease_holder="n2"))
    await client.report_fold(fold("n3"))  # neither exports nor bootstrapped
    assert [(f.node, f.role, f.lease_holder, f.restore) for f in await client.list_folds()] == [
        ("n1", "standby", "n2", restore), ("n2", "exporter", "n2", None),
        ("n3", None, None, None)]  # fmt: skip
    # A plain node's body names none of the new fields: an older server still takes it.
    assert not {"role", "lease_holder", "restore"} & msgspec.to_builtins(fold()).keys()


async def test_a_fold_that_stops_reporting_turns_stale(
    client: AsyncClient, clock: ManualClock
) -> None:
    await client.report_fold(fold(interval_ms=2000))
    clock.advance(STALE_INTERVALS * 2000)
    [status] = await client.list_folds()
    assert (status.age_ms, status.stale) == (6000, False)
    clock.advance(1)
    [status] = await client.list_folds()
    assert (status.age_ms, status.stale) == (6001, True)
    metrics = await client.metrics()
    assert 'waymark_fold_stale{fold="orders",node="n1"} 1.0' in metrics
    assert 'waymark_fold_lag{fold="orders",node="n1"} 4.0' in metrics
    await client.report_fold(fold(interval_ms=2000))  # it came back
    [status] = await client.list_folds()
    assert (status.age_ms, status.stale) == (0, False)


async def test_a_fold_s_final_report_says_it_ended_and_is_never_stale(
    client: AsyncClient, clock: ManualClock
) -> None:
    failed = FoldStopped("failed", 1_700_000_000_000, 4200, 250, 2, "NoServersError: gone")
    await client.report_fold(fold(interval_ms=2000, stopped=failed))
    await client.report_fold(fold("n2", interval_ms=2000, stopped=FoldStopped(
        "stopped", 1_700_000_000_000, 100, 0, 0)))  # fmt: skip
    clock.advance(10 * STALE_INTERVALS * 2000)  # long after: it said goodbye, not missing
    [n1, n2] = await client.list_folds()
    assert (n1.stopped, n1.stale, n1.lag) == (failed, False, 4)
    assert (n2.stopped and n2.stopped.outcome, n2.stale) == ("stopped", False)
    metrics = await client.metrics()
    assert 'waymark_fold_stopped{fold="orders",node="n1",outcome="failed"} 1.0' in metrics
    assert 'waymark_fold_stale{fold="orders",node="n1"} 0.0' in metrics
    await client.report_fold(fold(interval_ms=2000))  # restarted: running again
    [n1, _] = await client.list_folds()
    assert n1.stopped is None
    # A running node's body does not name the field: an older server still takes it.
    assert "stopped" not in msgspec.to_builtins(fold())


BAD_FOLDS = {
    "cursor past the bucket": {**msgspec.to_builtins(fold()), "cursor": 10},
    "unknown field": {**msgspec.to_builtins(fold()), "lagg": 1},
    "missing field": {k: v for k, v in msgspec.to_builtins(fold()).items() if k != "cursor"},
    "negative cursor": {**msgspec.to_builtins(fold()), "cursor": -1},
    "a / in the node": {**msgspec.to_builtins(fold()), "node": "a/b"},
    "interval too short": {**msgspec.to_builtins(fold()), "interval_ms": 10},
    "export without payload": {**msgspec.to_builtins(fold()), "export": {"cursor": 1,
                                                                         "time_ms": 1}},
    "unknown role": {**msgspec.to_builtins(fold()), "role": "leader"},
    "unknown restore phase": {**msgspec.to_builtins(fold()), "restore": {
        "artifact": "0123456789abcdef", "cursor": 1, "phase": "unpacking", "done_bytes": 0,
        "total_bytes": 1}},
}  # fmt: skip


async def refused_storing_nothing(app: App, client: AsyncClient, body: object) -> None:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w")
    async with http:
        answer = await http.post("/v0/folds", json=body)
        garbage = await http.post(
            "/v0/recovery/clients",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"
    assert garbage.status_code == 400
    assert garbage.json()["error"]["code"] == "invalid_request"
    assert await client.list_folds() == []
    assert (await client.list_recovery_clients()).clients == []
    assert app.engine.get_topic(FOLDS_TOPIC, touch=False).count == 0


@pytest.mark.parametrize("body", BAD_FOLDS.values(), ids=BAD_FOLDS.keys())
async def test_a_bad_fold_report_is_refused_and_stores_nothing(
    app: App, client: AsyncClient, body: dict[str, object]
) -> None:
    await refused_storing_nothing(app, client, body)


async def test_mutant_without_the_cursor_guard_is_caught(
    app: App, client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reports_module, "check_fold", lambda report: None)
    with pytest.raises(AssertionError):
        await refused_storing_nothing(app, client, BAD_FOLDS["cursor past the bucket"])


async def test_a_recovery_client_is_behind_by_the_checkpoints_after_its_watermark(
    app: App, client: AsyncClient
) -> None:
    engine = app.engine
    ids = []
    for i in range(3):  # three change checkpoints (the server's loop, driven by hand)
        engine.append("t", [RecordIn.of(i, tag=f"k{i}")])
        result = engine.emit_checkpoint()
        assert result is not None
        ids.append(result.seqs[0])
    status = await client.report_recovery(RecoveryReport("c1", ids[0], 1, 2))
    assert status.behind == 2
    await client.report_recovery(RecoveryReport("c0", None, 0, 0))
    clients = await client.list_recovery_clients()
    assert clients.newest_checkpoint == ids[-1]
    assert [(c.client, c.watermark, c.behind) for c in clients.clients] == [
        ("c0", None, 3), ("c1", ids[0], 2)]  # fmt: skip
    await client.report_recovery(RecoveryReport("c1", ids[-1], 0, 0))
    clients = await client.list_recovery_clients()
    assert [(c.client, c.behind) for c in clients.clients] == [("c0", 3), ("c1", 0)]
    metrics = await client.metrics()
    assert 'waymark_recovery_client_behind{client="c1"} 0.0' in metrics
    assert "waymark_recovery_clients_behind 1.0" in metrics


async def test_the_log_keeps_one_record_per_reporter(app: App, client: AsyncClient) -> None:
    for i in range(20):
        await client.report_fold(fold(f"n{i % 2}", cursor=i, bucket_seq=i))
        await client.report_recovery(RecoveryReport("c", i, 0, 0))
    assert app.engine.get_topic(FOLDS_TOPIC, touch=False).count == 2
    assert app.engine.get_topic(RECOVERY_TOPIC, touch=False).count == 1


async def test_a_node_or_client_taken_out_of_service_is_forgotten(
    client: AsyncClient,
) -> None:
    for node in ("n1", "n2", "n3"):
        await client.report_fold(fold(node))
    await client.report_recovery(RecoveryReport("c1", 4, 0, 0))
    gone = await client.forget_fold("orders", ["n2"])
    assert [f.node for f in gone] == ["n2"]
    assert [f.node for f in await client.get_fold("orders")] == ["n1", "n3"]
    assert [f.node for f in await client.forget_fold("orders")] == ["n1", "n3"]
    assert await client.list_folds() == []
    assert (await client.forget_recovery_client("c1")).watermark == 4
    assert (await client.list_recovery_clients()).clients == []
    for forget in (lambda: client.forget_fold("orders"),
                   lambda: client.forget_recovery_client("c1")):  # fmt: skip
        with pytest.raises(ApiError) as refused:
            await forget()
        assert (refused.value.status, refused.value.code) == (404, "not_found")
    await client.report_fold(fold("n2"))  # reporting again lists it again
    assert [f.node for f in await client.list_folds()] == ["n2"]


def test_reports_survive_a_sigkill(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = spawn_server(tmp_path)
    export = FoldExport(3, 1_700_000_000_000, "p/3")
    with Client(server.url) as client:
        client.report_fold(fold(cursor=1, bucket_seq=2))
        client.report_fold(fold(cursor=3, bucket_seq=7, export=export))
        client.report_recovery(RecoveryReport("c1", 0, 2, 1))
        before = [(f.node, f.cursor, f.lag, f.export, f.reported_ms) for f in client.list_folds()]
    assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    server = spawn_server(tmp_path)
    with Client(server.url) as client:
        after = [(f.node, f.cursor, f.lag, f.export, f.reported_ms) for f in client.list_folds()]
        [recovered] = client.list_recovery_clients().clients
    assert after == before == [("n1", 3, 4, export, before[0][4])]
    assert (recovered.client, recovered.watermark, recovered.range_receipts) == ("c1", 0, 2)


# --- the model: the newest report per reporter, stale after STALE_INTERVALS ----------
class ReportsMachine(RuleBasedStateMachine):
    """Reports of a few fold nodes under awkward clocks and intervals, the server's
    memory read back from its log at any point: what it serves is always the newest
    report of each node, stale exactly when STALE_INTERVALS of its intervals passed."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.engine = Engine(clock=self.clock)
        self.api = ReportsApi(self.engine, self.engine.limits)
        self.model: dict[str, tuple[FoldReport, int]] = {}
        self.clients: dict[str, tuple[RecoveryReport, int]] = {}

    @rule(
        node=st.sampled_from(["a", "b", "c"]),
        cursor=st.integers(0, 2**63 - 1),
        ahead=st.integers(0, 5),
        interval=st.sampled_from([100, 101, 5000, 3_600_000]),
    )
    def report(self, node: str, cursor: int, ahead: int, interval: int) -> None:
        bucket_seq = min(cursor + ahead, 2**63 - 1)
        report = fold(node, cursor, bucket_seq, interval_ms=interval)
        self.api.folds.store(report)
        self.model[f"orders/{node}"] = (report, self.clock.now_ms())

    @rule(
        client=st.sampled_from(["x", "y"]),
        watermark=st.none() | st.integers(0, 50),
        interval=st.sampled_from([100, 5000]),
    )
    def report_recovery(self, client: str, watermark: int | None, interval: int) -> None:
        report = RecoveryReport(client, watermark, 0, 0, interval)
        self.api.clients.store(report)
        self.clients[client] = (report, self.clock.now_ms())

    @rule(node=st.sampled_from(["a", "b", "c"]), client=st.sampled_from(["x", "y", None]))
    def forget(self, node: str, client: str | None) -> None:
        if (tag := f"orders/{node}") in self.model:
            self.api.folds.drop([tag])
            del self.model[tag]
        if client in self.clients:
            self.api.clients.drop([client])
            del self.clients[client]

    @rule(ms=st.sampled_from([0, 1, 299, 300, 301, 15_000, 10_800_001]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def restart(self) -> None:
        self.api = ReportsApi(self.engine, self.engine.limits)  # reads its logs back

    @invariant()
    def serves_the_newest_per_node(self) -> None:
        now = self.clock.now_ms()
        served = {f"{f.fold}/{f.node}": f for f in self.api.fold_list()}
        assert served.keys() == self.model.keys()
        for tag, (report, at) in self.model.items():
            status = served[tag]
            assert (status.cursor, status.bucket_seq, status.interval_ms) == (
                report.cursor, report.bucket_seq, report.interval_ms)  # fmt: skip
            assert status.lag == report.bucket_seq - report.cursor
            assert status.stale == (now - at > STALE_INTERVALS * report.interval_ms)
        assert self.engine.get_topic(FOLDS_TOPIC, touch=False).count == len(self.model)
        clients = {c.client: c for c in self.api.client_list().clients}
        assert clients.keys() == self.clients.keys()
        for name, (report, at) in self.clients.items():
            assert (clients[name].watermark, clients[name].reported_ms) == (report.watermark, at)
            assert clients[name].stale == (now - at > STALE_INTERVALS * report.interval_ms)
        assert self.engine.get_topic(RECOVERY_TOPIC, touch=False).count == len(self.clients)


ReportsMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=20,
                                            deadline=None, database=None,
                                            derandomize=True)  # fmt: skip


def test_reports_model() -> None:
    run_machine()


def run_machine() -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(ReportsMachine, settings=ReportsMachine.TestCase.settings)


# --- mutants: each guard broken, the tests above catch it -----------------------------
def machine_fails() -> None:
    """The model fails: an AssertionError, or several distinct ones hypothesis groups."""
    try:
        run_machine()
    except AssertionError:
        return
    except ExceptionGroup as group:
        assert all(isinstance(e, AssertionError) for e in group.exceptions), group
        return
    raise AssertionError("the model passed against the mutant")


def test_mutant_no_compaction_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Older records of a reporter kept: the log grows and the model's count fails."""
    monkeypatch.setattr(Engine, "delete", lambda self, *a, **kw: None)
    machine_fails()


def test_mutant_stale_never_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale rule that never fires (the silent "healthy")."""
    monkeypatch.setattr(reports_module, "STALE_INTERVALS", 10**9)
    machine_fails()


def test_mutant_forgetting_on_restart_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reports held in memory only: a restart serves none of them."""
    original = Kept.__init__

    def forgetful(self: Kept, *args: Any) -> None:  # type: ignore[type-arg]
        original(self, *args)
        self.latest.clear()

    monkeypatch.setattr(Kept, "__init__", forgetful)
    machine_fails()


def test_mutant_forget_in_memory_only_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forgotten reporter left in the log: a restart brings it back."""
    monkeypatch.setattr(Kept, "drop", lambda self, tags: [self.latest.pop(t) for t in tags])
    machine_fails()
