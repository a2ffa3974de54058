"""A hypothesis property of docs/semantics/topics.md §8.5 (docs/routers.md, "DAG by default"):
over random router graphs built in random order, with random allow_cycle flags, router
deletions, appends and forwarding steps, every definition is either admitted or refused
with ``router_cycle`` (never with allow_cycle) or ``router_dest_fan_in``; forwarding then
reaches quiescence within a bound, and the records stay bounded by the hop cap.

The bound: a record appended once is forwarded by each router at most HOP_CAP + 1
times (its copies go round a cycle at most HOP_CAP hops), so the topics hold at most
``appends * (1 + (HOP_CAP + 1) * routers)`` records. Routers between the same pair of
topics are left out: parallel routers multiply the copies on every hop (still finite).
"""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Engine, ErrorCode, RecordIn, TopicError
from waymark.log.router import HOP_CAP

TOPICS = ("t0", "t1", "t2", "t3")
topic = st.sampled_from(TOPICS)
Op = tuple[str, str, str, bool]


@st.composite
def cycle(draw: st.DrawFn) -> list[Op]:
    """The routers of one cycle over 2 to 4 topics, each with a random allow_cycle flag,
    put in a random order: the closing router may be plain or allow_cycle."""
    ring = draw(st.permutations(TOPICS))[: draw(st.integers(2, 4))]
    edges = [("put", a, b, draw(st.booleans())) for a, b in pairwise((*ring, ring[0]))]
    return draw(st.permutations(edges))


append = st.tuples(st.just("append"), topic, st.sampled_from(["1", "3"]), st.just(False))
forward = st.tuples(st.just("forward"), st.sampled_from(["1", "2", "1000"]), st.just(""),
                    st.just(False))  # fmt: skip
ops = st.tuples(
    cycle(),
    append,
    st.lists(
        st.one_of(
            st.tuples(st.just("put"), topic, topic, st.booleans()),
            st.tuples(st.just("delete"), st.integers(0, 7), st.just(""), st.just(False)),
            append,
            forward,
        ),
        max_size=25,
    ),
).map(lambda parts: [*parts[0], parts[1], *parts[2]])


class Graph:
    def __init__(self) -> None:
        self.engine = Engine(clock=ManualClock())
        for name in TOPICS:
            self.engine.put_topic(name, ConfigPatch())
        self.created = 0  # routers ever created
        self.appended = 0

    def put(self, source: str, dest: str, allow_cycle: bool) -> None:
        if any((r.source, r.dest) == (source, dest) for r in self.engine.list_routers()):
            return  # parallel routers: outside this bound (see the module docstring)
        name = f"r{self.created}-{source}-{dest}"
        try:
            self.engine.put_router(name, source, dest, allow_cycle=allow_cycle)
        except TopicError as refused:
            if refused.code is ErrorCode.ROUTER_CYCLE:
                assert not allow_cycle or source == dest, "allow_cycle was refused"
                cycle = refused.detail["cycle"]
                assert cycle[0] == cycle[-1] == source and cycle[1] == dest
                for a, b in pairwise(cycle[1:]):  # the path it would close is there
                    assert any((r.source, r.dest) == (a, b) for r in self.engine.list_routers())
            else:
                assert refused.code is ErrorCode.TOPIC_EXISTS_INCOMPATIBLE
                assert refused.detail["reason"] == "router_dest_fan_in"
            return
        self.created += 1

    def apply(self, op: Op) -> None:
        kind, a, b, flag = op
        if kind == "put":
            self.put(a, b, flag)
        elif kind == "delete":
            routers = self.engine.list_routers()
            if routers:
                self.engine.delete_router(routers[int(a) % len(routers)].name)
        elif kind == "append":
            self.engine.append(a, [RecordIn.of(i) for i in range(int(b))])
            self.appended += int(b)
        else:
            self.engine.forward(max_records=int(a))

    def records(self) -> int:
        return sum(self.engine.get_topic(name, touch=False).count for name in TOPICS)

    def bound(self) -> int:
        return self.appended * (1 + (HOP_CAP + 1) * self.created)


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(ops)
def test_forwarding_terminates_within_the_hop_bound_for_any_router_graph(
    script: list[Op],
) -> None:
    graph = Graph()
    for op in script:
        graph.apply(op)
        assert graph.records() <= graph.bound()
    for _ in range(graph.bound() + 2):  # each pass that is not the last copies a record
        step = graph.engine.forward()
        assert graph.records() <= graph.bound(), "forwarding went past the hop bound"
        if not (step.copies or step.pending):
            break
    else:
        pytest.fail("forwarding did not reach quiescence")
    assert graph.records() <= graph.bound()
