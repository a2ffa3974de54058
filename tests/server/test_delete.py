"""Deletion over HTTP (docs/semantics/topics.md §7): before_seq, tag Eq/Glob, combined,
point-in-time, silent."""

from __future__ import annotations


def tagged(api, topic: str, *tags: str | None) -> None:
    api.append(topic, *({"data": i} if t is None else {"data": i, "tag": t}
                        for i, t in enumerate(tags)))  # fmt: skip


def live(api, topic: str) -> list[int]:
    return [r["$seq"] for r in api.diff(topic, 0)["records"]]


def test_before_seq_deletes_everything_below(api, topic) -> None:
    api.write(topic, *range(6))
    result = api.delete(topic, before_seq=4)
    # head_seq 7: the deletion took a seq of its own, which no reader sees
    # (docs/semantics/topics.md §7.1)
    assert result == {"deleted": 3, "earliest_seq": 4, "head_seq": 7, "count": 3,
                      "bytes": 3}  # fmt: skip
    assert live(api, topic) == [4, 5, 6]
    assert api.delete(topic, before_seq=2)["head_seq"] == 7  # removes nothing: takes none
    page = api.diff(topic, 6)
    assert page["records"] == [] and page["tombstone"] is None and page["next_from_seq"] == 7


def test_match_eq_deletes_exact_tag_only(api, topic) -> None:
    tagged(api, topic, "a", "ab", "a", None, "b")
    assert api.delete(topic, match=["tag", "Eq", "a"])["deleted"] == 2
    assert live(api, topic) == [2, 4, 5]


def test_bare_string_match_is_eq(api, topic) -> None:
    tagged(api, topic, "a", "ab")
    assert api.delete(topic, match="a")["deleted"] == 1
    assert live(api, topic) == [2]


def test_match_glob_is_a_trailing_prefix(api, topic) -> None:
    tagged(api, topic, "chat-42:1", "chat-42:2", "chat-420", "chat-4", None)
    assert api.delete(topic, match=["tag", "Glob", "chat-42:*"])["deleted"] == 2
    assert live(api, topic) == [3, 4, 5]


def test_match_glob_is_the_one_glob_syntax(api, topic) -> None:
    """docs/globs.md: wildcards anywhere, over HTTP as in-process."""
    tagged(api, topic, "user:1:eu", "user:22:eu", "user:3:us", "user:eu")
    assert api.delete(topic, match=["tag", "Glob", "user:?:eu"])["deleted"] == 1
    assert api.delete(topic, match=["tag", "Glob", "user:*:[e]?"])["deleted"] == 1  # 22
    assert live(api, topic) == [3, 4]


def test_untagged_records_are_never_matched(api, topic) -> None:
    tagged(api, topic, None, None, "x")
    assert api.delete(topic, match=["tag", "Glob", "*"])["deleted"] == 1
    assert live(api, topic) == [1, 2]


def test_match_and_before_seq_combine_as_and(api, topic) -> None:
    tagged(api, topic, "msg-123", "other", "msg-123", "msg-123")
    # Keep v2 (seq 4) of msg-123; drop its earlier versions.
    assert api.delete(topic, match=["tag", "Eq", "msg-123"], before_seq=4)["deleted"] == 2
    assert live(api, topic) == [2, 4]


def test_a_match_delete_is_point_in_time(api, topic) -> None:
    tagged(api, topic, "t", "t")
    api.delete(topic, match="t")
    tagged(api, topic, "t")  # a later record with the same tag stays
    assert live(api, topic) == [4]  # (3: the deletion's own seq)


def test_deletion_is_silent_and_does_not_move_evict_floor(api, topic) -> None:
    tagged(api, topic, "x", "x", "y")
    api.delete(topic, match="x")
    state = api.state(topic)
    assert (state["earliest_seq"], state["evict_floor"], state["count"]) == (3, 1, 1)
    page = api.diff(topic, 0)
    assert page["tombstone"] is None
    assert [r["$seq"] for r in page["records"]] == [3]


def test_interior_deletes_leave_earliest_seq_alone(api, topic) -> None:
    tagged(api, topic, None, "x", None)
    result = api.delete(topic, match="x")
    assert (result["earliest_seq"], result["count"]) == (1, 2)
    assert live(api, topic) == [1, 3]


def test_delete_needs_a_selector(api, topic) -> None:
    api.write(topic, 1)
    api.error(api.post(topic, "delete"), 400, "invalid_request")
    api.error(api.post(topic, "delete", before_seq=None, match=None), 400, "invalid_request")


def test_delete_grammar_errors_are_400(api, topic) -> None:
    api.write(topic, 1)
    for match in (["tag", "Glob", 7], ["tag", "Regex", "x"], ["seq", "Eq", "1"],
                  ["tag", "Eq"], 5, {"tag": "x"}):  # fmt: skip
        api.error(api.post(topic, "delete", match=match), 400, "invalid_request")
    api.error(api.post(topic, "delete", before_seq=-1), 400, "invalid_request")
    assert live(api, topic) == [1]


def test_delete_on_a_missing_topic_is_404(api, topic) -> None:
    api.error(api.post(topic, "delete", before_seq=1), 404, "topic_not_found")
