"""The streamed device-to-host path's CPU-side logic, with a fake device.

The fake device copies when the copy's event is waited for (as an asynchronous copy
completes some time after it is issued), and records every operation, so the tests see
the order in which slots are filled, waited for, handed over and reused.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradvault.core.store._device_stream import RingStreamer

from ..fake_device import FakeDevice, address_of


def _source(nbytes: int) -> np.ndarray:
    return np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)


@pytest.mark.parametrize("nbytes", [0, 1, 999, 1000, 1001, 4000, 10_007])
def test_pieces_cover_every_byte_once_in_order(nbytes: int) -> None:
    device = FakeDevice()
    ring = RingStreamer(device, slots=3, slot_bytes=1000)
    source = _source(nbytes)
    pieces = [bytes(view) for view in ring.stream(source, nbytes)]
    assert b"".join(pieces) == source.tobytes()
    assert all(len(piece) == 1000 for piece in pieces[:-1])
    assert len(pieces) == -(-nbytes // 1000)
    assert device.in_flight == 0


def test_host_memory_is_the_ring_whatever_the_size() -> None:
    device = FakeDevice()
    ring = RingStreamer(device, slots=2, slot_bytes=4096)
    for nbytes in (1 << 16, 1 << 20):
        for _ in ring.stream(_source(nbytes), nbytes):
            pass
    assert device.allocated == ring.host_bytes == 2 * 4096
    addresses = {entry[4] for entry in device.log if entry[0] == "copy"}
    assert len(addresses) == 2  # every chunk went into one of the two slots


def test_a_slot_is_refilled_only_after_its_chunk_was_consumed() -> None:
    device = FakeDevice()
    ring = RingStreamer(device, slots=2, slot_bytes=100)
    source = _source(1000)
    consumed: list[int] = []
    for index, view in enumerate(ring.stream(source, 1000)):
        # while the consumer holds a piece, no copy targets its slot
        held = address_of(view)
        copies_now = [e for e in device.log if e[0] == "copy"]
        later = [e for e in copies_now if e[1] > index and e[4] == held]
        assert not later, f"piece {index}: its slot was given a new copy while held"
        assert bytes(view) == source[index * 100 : (index + 1) * 100].tobytes()
        consumed.append(index)
    assert consumed == list(range(10))


def test_copies_overlap_the_consumer() -> None:
    device = FakeDevice()
    ring = RingStreamer(device, slots=4, slot_bytes=10)
    stream = ring.stream(_source(100), 100)
    next(stream)
    # while piece 0 is consumed, the next three chunks are already being copied
    assert device.in_flight == 3
    stream.close()
    assert device.in_flight == 0  # closing early still waits for the copies in flight


def test_each_piece_is_waited_for_before_it_is_handed_over() -> None:
    device = FakeDevice()
    ring = RingStreamer(device, slots=3, slot_bytes=64)
    for index, _ in enumerate(ring.stream(_source(640), 640)):
        waited = [e[1] for e in device.log if e[0] == "wait"]
        assert waited[-1] == index


def test_pieces_follow_the_chunk_size_asked_for() -> None:
    device = FakeDevice()
    ring = RingStreamer(device, slots=2, slot_bytes=100)
    source = _source(250)
    lengths = [len(view) for view in ring.stream(source, 250, chunk_bytes=60)]
    assert lengths == [60, 60, 60, 60, 10]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"slots": 0}, "slots must be an int >= 1"),
        ({"slots": 2.0}, "slots must be an int >= 1"),
        ({"slot_bytes": 0}, "slot_bytes must be an int >= 1"),
    ],
)
def test_bad_ring_settings_are_refused(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RingStreamer(FakeDevice(), **arguments)


def test_bad_stream_arguments_are_refused() -> None:
    ring = RingStreamer(FakeDevice(), slots=1, slot_bytes=10)
    with pytest.raises(ValueError, match=r"chunk_bytes must be an int in \[1, 10\]"):
        next(ring.stream(_source(10), 10, chunk_bytes=11))
    with pytest.raises(ValueError, match="nbytes must be an int >= 0"):
        next(ring.stream(_source(10), -1))
