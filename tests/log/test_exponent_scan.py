"""The quick scan of a write for numbers that may be infinite as doubles
(``waymark.log.records``: ``_may_be_poison`` record by record, ``_has_exponent`` in bulk)
never lets one through, wherever it stands, and takes a digit before an ``e`` inside a
string (a hex id's ``"1e5f"``) for no exponent, so a write of hex ids is not parsed
(docs/semantics/topics.md, "Readable data"). Each broken guard (a mutant) is caught."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from waymark.log import records as records_module
from waymark.log.errors import TopicError
from waymark.log.records import encode_batch, plain_records
from waymark.protocol import ErrorCode, Limits, RecordIn

LIMITS = Limits()
SETTINGS = settings(max_examples=100, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
# A mutant only needs to be found, not shrunk: the hunt stops at the first failure.
MUTANT = settings(SETTINGS, max_examples=400, phases=[Phase.explicit, Phase.generate])

# Hex ids (and other text with a digit before an "e") as strings, in values and keys.
STRING = st.text("0123456789abcdefE", min_size=1, max_size=12).map(lambda s: b'"%b"' % s.encode())
# Numbers with an exponent, infinite and finite as doubles, and numbers without one.
EXPONENTS = [b"1e999", b"-1E400", b"2.5e+309", b"9e308", b"1e5", b"7E-3", b"0e0"]
PLAIN = [b"12", b"-0.5", b"3", b"18446744073709551617"]


def values(numbers: list[bytes]) -> st.SearchStrategy[bytes]:
    """JSON values (as compact text) of strings and these numbers at every depth: at the
    top, in arrays, as an object's values, before and after strings."""
    leaf = STRING | st.sampled_from(numbers) | st.sampled_from([b"true", b"null"])
    return st.recursive(
        leaf,
        lambda inner: (
            st.lists(inner, max_size=4).map(lambda xs: b"[" + b",".join(xs) + b"]")
            | st.lists(st.tuples(STRING, inner), max_size=3).map(
                lambda kvs: b"{" + b",".join(k + b":" + v for k, v in kvs) + b"}"
            )
        ),
        max_leaves=8,
    )


WRITES = st.lists(values(EXPONENTS + PLAIN), min_size=1, max_size=6)
HEX_WRITES = st.lists(values(PLAIN), min_size=1, max_size=6)


def first_unreadable(datas: list[bytes]) -> int | None:
    """The oracle: the index of the first record a reader (orjson) cannot decode."""
    for index, data in enumerate(datas):
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError:
            return index
    return None


def bulk(datas: list[bytes]) -> records_module.PlainRecords | None:
    """The bulk path over a stage's bare array of these records."""
    array = b"[" + b",".join(b'{"data":%b}' % d for d in datas) + b"]"
    return plain_records(array, [msgspec.Raw(d) for d in datas], LIMITS)


def check_write(datas: list[bytes]) -> None:
    bad = first_unreadable(datas)
    try:
        encode_batch([RecordIn(msgspec.Raw(d)) for d in datas], LIMITS)
        assert bad is None, f"record {bad} holds an infinite number and was kept"
    except TopicError as refused:
        assert refused.code == ErrorCode.INVALID_RECORD and refused.detail["index"] == bad
    assert bad is None or bulk(datas) is None, "the bulk path proved an infinite number clean"


# An infinite number at the top, first in an array, after a hex id, as a hex key's
# value, last, and after a record holding a string (the quotes are counted across
# records); a hex id as a key before an infinite value.
@example(datas=[b"1e999"])
@example(datas=[b"[1E400]"])
@example(datas=[b'["1e5f",1e999]'])
@example(datas=[b'{"1e5":2E400}'])
@example(datas=[b'{"id":"9e","n":[3,-1e999]}'])
@example(datas=[b'"9e"', b"2.5e+309"])
@example(datas=[b'{"a":"1e"}', b'[1,"0e",1e999]'])
@given(datas=WRITES)
@SETTINGS
def test_a_write_is_refused_iff_a_record_holds_an_infinite_number(datas: list[bytes]) -> None:
    check_write(datas)


def check_hex_ids(datas: list[bytes]) -> None:
    assert not records_module._may_be_poison(b"".join(datas))  # noqa: SLF001
    assert bulk(datas) is not None


@example(datas=[b'{"id":"1e5f3a","n":7}'])
@example(datas=[b'{"1e":"2E"}', b'"3e"'])
@given(datas=HEX_WRITES)
@SETTINGS
def test_hex_ids_in_strings_take_no_parse(datas: list[bytes]) -> None:
    """Strings with a digit before an ``e`` and numbers without an exponent: the scan
    proves the write readable, record by record and in bulk."""
    check_hex_ids(datas)


def test_text_whose_quotes_do_not_pair_up_is_parsed() -> None:
    """Data that is not JSON (an in-process caller's, never decoded) cannot have its
    strings told by counting quotes: the write is parsed, and refused."""
    with pytest.raises(TopicError) as refused:
        encode_batch([RecordIn(msgspec.Raw(b'"ab')), RecordIn(msgspec.Raw(b"1e999"))], LIMITS)
    assert refused.value.code == ErrorCode.INVALID_RECORD and refused.value.detail["index"] == 0


def _flipped(text: bytes) -> bool:
    """The scan with the string test inverted: a pair is a number's when inside quotes."""
    codes = np.frombuffer(text, np.uint8)
    exponent = ((codes[1:] | 0x20) == ord("e")) & ((codes[:-1] - ord("0")) < 10)
    before = np.searchsorted(np.flatnonzero(codes == ord('"')), np.flatnonzero(exponent))
    return bool((before & 1).any())


def _anywhere(text: bytes) -> bool:
    """The scan before strings were told apart: any digit before an ``e``."""
    codes = np.frombuffer(text, np.uint8)
    return bool((((codes[1:] | 0x20) == ord("e")) & ((codes[:-1] - ord("0")) < 10)).any())


MUTANTS: dict[str, tuple[Callable[[bytes], bool], Callable[[list[bytes]], None], object]] = {
    "no exponent check": (lambda _: False, check_write, WRITES),
    "string test inverted": (_flipped, check_write, WRITES),
    "strings not told apart": (_anywhere, check_hex_ids, HEX_WRITES),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_broken_guard_is_caught(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scan, check, writes = MUTANTS[mutant]
    monkeypatch.setattr(records_module, "_has_exponent", scan)

    @given(datas=writes)
    @MUTANT
    def hunt(datas: list[bytes]) -> None:
        check(datas)

    with pytest.raises(AssertionError):
        hunt()
