"""The ring's arithmetic: which slot an insert goes to, which slots a claim reads,
which the rotation may empty (outbox.postgres.ring; no database)."""

from __future__ import annotations

import pytest

from outbox.postgres.ring import STAY, Ring, SlotPicker

RING = Ring(slots=2, seconds=10)


@pytest.mark.parametrize(
    ("epoch", "slot"), [(0.0, 0), (9.99, 0), (10.0, 1), (19.5, 1), (20.0, 0), (1e9 + 5, 0)]
)
def test_an_insert_goes_to_the_slot_of_its_time(epoch: float, slot: int) -> None:
    assert RING.current(epoch) == slot


def test_a_claim_reads_the_slot_before_only_for_the_grace_after_the_turn() -> None:
    assert RING.grace == 1.0
    assert RING.live(20.5) == [0, 1]  # 0 is current; 1 still holds its last messages
    assert RING.live(20.9) == [0, 1]
    assert RING.live(21.0) == [0]
    assert RING.live(29.9) == [0]
    assert RING.every == [STAY, 0, 1]


def test_the_rotation_empties_a_slot_only_between_two_graces() -> None:
    # Slot 1 stopped being current at 20 and is current again at 30.
    assert RING.emptiable(20.9) == []  # its last transactions may still commit
    assert RING.emptiable(21.0) == [1]
    assert RING.emptiable(29.0) == [1]
    assert RING.emptiable(29.1) == []  # producers are about to insert into it
    three = Ring(slots=3, seconds=10)  # slot 2 is current from 20 to 30
    assert three.emptiable(25.0) == [0, 1]
    assert three.emptiable(20.5) == [0]  # slot 1 was current until 20


@pytest.mark.parametrize(("seconds", "pace"), [(10, 0.5), (1, 0.05), (3600, 1.0)])
def test_the_rotation_looks_twice_a_grace_and_at_most_once_a_second(
    seconds: int, pace: float
) -> None:
    assert Ring(seconds=seconds).pace == pytest.approx(pace)


def test_a_picker_reads_every_slot_first_then_the_live_ones_and_stay_while_it_is_due() -> None:
    picker = SlotPicker()
    picker.update((2, 10, 25.0, None))  # the database's clock: 25 s, nothing in stay
    assert picker.pick() == ([STAY, 0, 1], None)  # the first claim looks everywhere
    slots, until = picker.pick()
    assert (slots, until) == ([RING.current(25.0)], None)

    picker.update((2, 10, 25.0, 24.0))  # stay holds a message due a second ago
    slots, until = picker.pick()
    assert slots[0] == STAY
    assert until is not None
    assert until.timestamp() == 24.0  # read from its due time

    picker.update((2, 10, 25.0, 60.0))  # due later: not read yet
    assert STAY not in picker.pick()[0]
    picker.moved()  # this store just moved messages there
    assert picker.pick()[0][0] == STAY


def test_a_ring_that_cannot_be_read_makes_every_claim_read_everything() -> None:
    picker = SlotPicker()
    picker.unread("permission denied for table outbox_ring")
    assert picker.pick() == ([STAY, 0, 1], None)
    assert picker.pick() == ([STAY, 0, 1], None)
    assert not picker.stale()  # tried again in a minute, not at every claim


def test_a_slot_with_a_backlog_being_moved_is_read_meanwhile() -> None:
    picker = SlotPicker()
    picker.update((2, 10, 25.0, None))
    picker.pick()  # the first look, everywhere
    picker.draining(1)  # slot 1 (not current at 25 s) holds more than a pass moves
    assert picker.pick()[0] == [0, 1]


def test_a_slot_a_claim_took_messages_from_is_read_until_one_takes_none() -> None:
    picker = SlotPicker()
    picker.update((2, 10, 25.0, None))  # slot 0 current, its grace over
    picker.pick()
    picker.found({1, STAY})  # a backlog still due in slot 1
    assert picker.pick()[0] == [0, 1]
    picker.found({0})  # slot 1 gave nothing more
    assert picker.pick()[0] == [0]
