"""The turn gate alone: no threads, no stages, one test per transition."""
from __future__ import annotations

import numpy as np

from s2s.messages import ReplyAudio, ReplyText, SpeechSegment, SpeechStarted, TurnConfirmed, TurnDiscarded
from s2s.turn_gate import CANCELLED, CONFIRMED, DISCARDED, OPENED, TurnEvent, TurnGate


def segment(turn: int, speculative: bool = True) -> SpeechSegment:
    return SpeechSegment(np.zeros(160, np.float32), 16000, turn, 0.0, 0.5, speculative=speculative)


def sound(turn: int) -> ReplyAudio:
    return ReplyAudio(np.zeros(240, np.float32), 24000, turn)


def gate(**kwargs) -> tuple[TurnGate, list, list[TurnEvent]]:
    delivered: list = []
    events: list[TurnEvent] = []
    turns = TurnGate(delivered.append, **kwargs)
    turns.listen(events.append)
    return turns, delivered, events


def test_a_turn_nobody_speculated_on_goes_straight_through():
    turns, delivered, events = gate()
    first = sound(0)
    turns.admit(first)
    assert delivered == [first] and events == [] and not turns.is_pending(0) and not turns.is_stale(0)


def test_a_speculative_segment_opens_a_turn_whose_output_is_held():
    turns, delivered, events = gate()
    turns.observe(segment(0))
    turns.admit(sound(0))
    assert delivered == [] and turns.is_pending(0) and events == [TurnEvent(OPENED, 0)]
    assert not turns.is_stale(0)  # held, not dropped: work on it goes on


def test_confirmation_releases_what_was_held_in_order_then_lets_the_rest_through():
    turns, delivered, events = gate()
    turns.observe(segment(0))
    held = [ReplyText("one.", 0), sound(0), sound(0)]
    for message in held:
        turns.admit(message)
    turns.admit(other := sound(3))  # another turn is not held
    turns.observe(TurnConfirmed(0, 1.0))
    later = sound(0)
    turns.admit(later)
    assert delivered == [other, *held, later]
    assert events == [TurnEvent(OPENED, 0), TurnEvent(CONFIRMED, 0)] and not turns.is_pending(0)


def test_a_second_confirmation_changes_nothing():
    turns, delivered, events = gate()
    turns.observe(segment(0))
    turns.observe(TurnConfirmed(0, 1.0))
    turns.observe(TurnConfirmed(0, 1.0))
    turns.observe(TurnConfirmed(5, 1.0))  # never speculative
    assert events == [TurnEvent(OPENED, 0), TurnEvent(CONFIRMED, 0)] and delivered == []


def test_a_discarded_turn_drops_what_was_held_and_is_stale_from_then_on():
    turns, delivered, events = gate()
    turns.observe(segment(0))
    turns.admit(sound(0))
    turns.observe(TurnDiscarded(0))
    turns.observe(TurnConfirmed(0, 1.0))  # too late: nothing comes back
    turns.observe(TurnDiscarded(0))  # once only
    assert delivered == [] and turns.is_stale(0) and turns.is_discarded(0) and not turns.is_pending(0)
    assert events == [TurnEvent(OPENED, 0), TurnEvent(DISCARDED, 0)]
    assert not turns.is_stale(1) and not turns.is_stale(None)


def test_a_speculative_segment_of_a_discarded_turn_does_not_reopen_it():
    turns, _, events = gate()
    turns.observe(TurnDiscarded(2))
    turns.observe(segment(2))
    assert not turns.is_pending(2) and events == [TurnEvent(DISCARDED, 2)]


def test_barge_in_makes_older_turns_stale_only_when_on():
    turns, _, events = gate()
    turns.observe(SpeechStarted(3))
    assert not turns.is_stale(2) and events == []
    turns.barge_in = True
    turns.observe(SpeechStarted(3))
    turns.observe(SpeechStarted(2))  # never moves back
    assert turns.is_stale(2) and not turns.is_stale(3) and events == [TurnEvent(CANCELLED, 3)]


def test_cancel_below_makes_older_turns_stale_without_barge_in():
    turns, _, events = gate()
    turns.cancel_below(4)
    turns.cancel_below(4)
    assert [turns.is_stale(t) for t in (0, 3, 4)] == [True, True, False] and events == [TurnEvent(CANCELLED, 4)]


def test_half_duplex_is_deaf_from_the_end_of_the_users_turn_until_its_reply_has_played():
    turns, _, _ = gate(half_duplex=True)
    assert not turns.deaf
    turns.observe(segment(0, speculative=False))
    assert turns.deaf
    turns.played(7)  # another turn's reply
    assert turns.deaf
    turns.played(0)
    assert not turns.deaf


def test_half_duplex_waits_for_the_confirmation_of_a_speculative_turn():
    turns, _, _ = gate(half_duplex=True)
    turns.observe(segment(1))
    assert not turns.deaf  # the user may still go on
    turns.observe(TurnConfirmed(1, 1.0))
    assert turns.deaf
    turns.played(1)
    assert not turns.deaf


def test_full_duplex_never_goes_deaf():
    turns, _, _ = gate()
    turns.observe(segment(0, speculative=False))
    turns.observe(segment(1))
    turns.observe(TurnConfirmed(1, 1.0))
    assert not turns.deaf


def test_a_listener_may_ask_the_gate_about_the_turn_it_is_told_of():
    turns = TurnGate()
    seen = []
    turns.listen(lambda event: seen.append((event.kind, turns.is_pending(event.turn), turns.is_stale(event.turn))))
    turns.observe(segment(0))
    turns.observe(TurnConfirmed(0, 1.0))
    turns.observe(segment(1))
    turns.observe(TurnDiscarded(1))
    assert seen == [(OPENED, True, False), (CONFIRMED, False, False), (OPENED, True, False), (DISCARDED, False, True)]


# ---------------------------------------------------------------- the Recorder follows a gate
def test_the_recorder_holds_console_lines_until_the_gate_confirms_and_forgets_what_it_discards(tmp_path, capsys):
    from s2s.messages import Transcript
    from s2s.metrics import Recorder

    turns = TurnGate()
    recorder = Recorder(tmp_path, console=True)
    recorder.watch(turns)
    for number in (0, 1):
        recorder.on_output("vad", segment(number), 1.0)
        turns.observe(segment(number))
        recorder.on_output("stt", Transcript(f"turn {number}", number), 2.0)
    assert capsys.readouterr().out == ""  # both still speculative
    turns.observe(TurnDiscarded(0))
    recorder.on_output("stt", Transcript("late", 0), 3.0)  # late news of a dropped attempt
    turns.observe(TurnConfirmed(1, 1.5))
    assert capsys.readouterr().out == "you: turn 1\n"
    assert list(recorder.turns) == [1] and not recorder.turns[1].speculative


def test_the_end_of_a_dropped_attempt_reaching_the_last_stage_leaves_no_trace_and_breaks_nothing(tmp_path):
    from s2s.messages import Transcript, TurnEnd
    from s2s.metrics import Recorder

    recorder = Recorder(tmp_path, last_stage="sink")
    # the STT heard nothing in the attempt (its end took a server session down with a KeyError), or words
    for words in ("", "Fidel lies."):
        recorder.on_output("vad", segment(0), 1.0)
        recorder.on_output("stt", Transcript(words, 0), 1.2) if words else None
        recorder.on_output("vad", TurnDiscarded(0), 2.0)
        recorder.on_output("sink", TurnEnd(0), 2.5)
        path = recorder.transcript_path
        assert list(recorder.turns) == [] and (not path.exists() or path.read_text() == "")
        recorder = Recorder(tmp_path / "again", last_stage="sink")


def test_a_recorder_no_graph_hands_a_gate_to_follows_the_messages_it_sees(tmp_path):
    from s2s.metrics import Recorder

    recorder = Recorder(tmp_path)
    recorder.on_output("vad", segment(0), 1.0)
    recorder.on_output("vad", TurnDiscarded(0), 2.0)
    recorder.on_output("vad", segment(1), 3.0)
    assert list(recorder.turns) == [1] and recorder.turns[1].speculative
    recorder.on_output("vad", TurnConfirmed(1, 1.5), 4.0)
    assert not recorder.turns[1].speculative


def test_holding_keeps_an_open_turns_items_in_order_until_it_is_confirmed_or_dropped():
    from s2s.turn_gate import Holding

    held: Holding[str] = Holding()
    assert not held.hold(1, "a") and held.release(1) is None  # not open: nothing waits
    held.open(1)
    held.open(2)
    assert held.hold(1, "a") and held.hold(1, "b") and held.hold(2, "x") and not held.hold(None, "?")
    held.open(1)  # opening again keeps what it holds
    assert held.release(1) == ["a", "b"] and 1 not in held
    held.drop(2)
    assert 2 not in held and held.release(2) is None
