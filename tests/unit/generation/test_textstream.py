"""TextStream: UTF-8 split over tokens, stop strings held back and cut."""

from __future__ import annotations

from modelyard.runtimes.textstream import TextStream


def test_multibyte_character_waits_until_complete() -> None:
    stream = TextStream()
    data = "é".encode()
    first = stream.push(1, data[:1])
    assert first.text == ""
    second = stream.push(2, data[1:])
    assert second.text == "é"
    assert second.token_ids == [1, 2]


def test_stop_string_is_cut_and_not_sent() -> None:
    stream = TextStream(("END",))
    sent = [stream.push(i, part.encode()).text for i, part in enumerate(["ab", "cE", "N", "Dx"])]
    assert "".join(sent) == "abc"
    assert stream.stopped
    assert stream.push(9, b"more").text == ""


def test_partial_stop_prefix_released_when_it_does_not_match() -> None:
    stream = TextStream(("END",))
    assert stream.push(0, b"xE").text == "x"
    assert stream.push(1, b"Nd").text == "ENd"
    assert not stream.stopped


def test_finish_flushes_held_text_and_broken_bytes() -> None:
    stream = TextStream(("zz",))
    assert stream.push(0, b"az").text == "a"
    assert stream.push(1, b"\xc3").text == ""
    assert stream.finish().text == "z\ufffd"
