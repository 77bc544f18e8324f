"""kit.latest: what the readers see, and which keys a replacement tells the listener."""

from __future__ import annotations

from kit.latest import Latest


def test_a_key_never_decided_reads_the_default() -> None:
    held: Latest[str, tuple[str, ...]] = Latest(())
    assert held.get("n1") == ()


def test_replace_answers_added_changed_and_gone_keys_once_sorted() -> None:
    held: Latest[str, tuple[str, ...]] = Latest(())
    assert held.replace({"n2": ("a",), "n1": ("b",)}) == ["n1", "n2"]
    assert held.replace({"n2": ("a",), "n1": ("c",), "n3": ("d",)}) == ["n1", "n3"]
    assert held.replace({"n2": ("a",)}) == ["n1", "n3"]
    assert (held.get("n1"), held.get("n2"), held.get("n3")) == ((), ("a",), ())
    assert held.replace({"n2": ("a",)}) == []


def test_the_producer_keeps_no_alias_to_the_mapping_it_gave() -> None:
    fresh = {"ns": 1}
    held: Latest[str, int] = Latest(0)
    held.replace(fresh)
    fresh["ns"] = 2
    assert held.get("ns") == 1
