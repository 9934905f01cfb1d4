"""The response queue's state machine, move by move (no socket, no graph, no event loop)."""
from __future__ import annotations

from s2s.server.responses import FINISHED, MOVES, Finished, Opened, Output, ResponseQueue, State


def kinds(steps) -> list[tuple]:
    """Steps as (kind, turn, what): compact enough to compare whole sequences."""
    shown = []
    for step in steps:
        if isinstance(step, Opened):
            shown.append(("opened", step.response.turn))
        elif isinstance(step, Output):
            shown.append(("output", step.response.turn, step.part))
        else:
            assert isinstance(step, Finished)
            shown.append(("finished", step.response.turn, step.response.state.value, step.announced))
    return shown


def test_a_response_opens_at_once_when_none_is_being_sent_and_completes_at_the_end():
    queue = ResponseQueue()
    assert not queue.busy and queue.active is None
    [opened] = queue.add(0, "Hello?")
    assert isinstance(opened, Opened) and opened.response.state is State.ACTIVE and queue.active is opened.response
    assert queue.busy
    assert kinds(queue.output(0, "Hi.")) == [("output", 0, "Hi.")]
    assert kinds(queue.complete(0)) == [("finished", 0, "completed", True)]
    assert not queue.busy and queue.active is None and queue.counts[State.COMPLETED] == 1


def test_a_later_response_waits_and_what_came_for_it_is_replayed_in_order_when_it_opens():
    queue = ResponseQueue()
    first = queue.add(0)[0].response
    assert queue.add(1) == []  # queued behind the one being sent
    assert queue.output(1, "b1") == [] and queue.output(1, "b2") == [] and queue.complete(1) == []
    assert queue.active is first and queue.busy
    steps = queue.complete(0)
    assert kinds(steps) == [("finished", 0, "completed", True), ("opened", 1), ("output", 1, "b1"),
                            ("output", 1, "b2"), ("finished", 1, "completed", True)]
    assert first.state is State.COMPLETED and steps[1].response.state is State.COMPLETED and not queue.busy


def test_pieces_for_a_turn_without_a_response_or_a_finished_one_are_dropped():
    queue = ResponseQueue()
    assert queue.output(7, "nobody asked") == [] and queue.complete(7) == []
    queue.add(0)
    queue.complete(0)
    assert queue.output(0, "late") == [] and queue.complete(0, "late call") == []
    assert queue.cancel(0, "client_cancelled") == []  # completed is final: no move out of it


def test_cancel_ends_the_active_response_and_nothing_more_reaches_it():
    queue = ResponseQueue()
    queue.add(0, "Tell me a story.")
    queue.output(0, "Once")
    [finished] = queue.cancel(0, "client_cancelled")
    assert kinds([finished]) == [("finished", 0, "cancelled", True)]
    assert finished.response.reason == "client_cancelled" and queue.counts[State.CANCELLED] == 1
    assert queue.output(0, "upon a time") == [] and queue.complete(0) == [] and not queue.busy


def test_barge_in_cancels_earlier_turns_only():
    queue = ResponseQueue()
    queue.add(0)
    steps = queue.barge_in(0)  # the turn's own start cancels nothing of it
    assert steps == [] and queue.active is not None
    steps = queue.barge_in(1)
    assert kinds(steps) == [("finished", 0, "cancelled", True)] and steps[0].response.reason == "turn_detected"
    assert kinds(queue.add(1)) == [("opened", 1)]  # the new turn's reply is sent


def test_barge_in_over_an_active_and_a_queued_response_cancels_both():
    """The queued one opens as the active one ends and is cancelled right after (the order clients see)."""
    queue = ResponseQueue()
    queue.add(0)
    queue.add(1)
    assert kinds(queue.barge_in(2)) == [("finished", 0, "cancelled", True), ("opened", 1),
                                        ("finished", 1, "cancelled", True)]
    assert queue.counts[State.CANCELLED] == 2 and not queue.busy


def test_a_queued_response_can_end_without_the_client_ever_hearing_of_it():
    queue = ResponseQueue()
    queue.add(0)
    queue.add(1)
    queue.add(2)
    steps = queue.barge_in(2)
    assert ("finished", 1, "cancelled", True) in kinds(steps)  # opened when 0 ended, then cancelled
    queue = ResponseQueue()
    queue.add(0)
    queue.add(1)
    steps = queue.fail_all()
    assert kinds(steps) == [("finished", 0, "failed", True), ("opened", 1), ("finished", 1, "failed", True)]
    queue = ResponseQueue()
    queue.add(5)
    assert queue.add(3) == []  # queued behind a later turn's reply: nothing announced for it yet
    [finished] = queue.barge_in(4)
    assert kinds([finished]) == [("finished", 3, "cancelled", False)] and queue.counts[State.CANCELLED] == 0
    assert queue.active.turn == 5


def test_a_tool_call_ends_the_response_and_its_output_continues_the_turn_as_a_new_one():
    queue = ResponseQueue()
    first = queue.add(0, "Weather in Paris?")[0].response
    assert queue.newest_open_turn() == 0
    call = {"call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert kinds(queue.complete(0, call)) == [("output", 0, call), ("finished", 0, "completed", True)]
    assert not queue.busy and queue.newest_open_turn() is None
    [opened] = queue.add(0)  # the client's function_call_output and response.create
    second = opened.response
    assert second is not first and second.id != first.id and second.turn == 0 and second.user_text is None
    assert kinds(queue.output(0, "Sunny.")) == [("output", 0, "Sunny.")]  # the turn's pieces go to the new one
    assert kinds(queue.complete(0)) == [("finished", 0, "completed", True)]
    assert queue.counts[State.COMPLETED] == 2


def test_a_second_response_create_waits_while_one_is_active_or_queued():
    queue = ResponseQueue()
    queue.add(0)
    assert queue.busy  # active: refused (conversation_already_has_active_response)
    queue.add(1)
    queue.complete(0)
    assert queue.busy and queue.active.turn == 1  # the queued one took over
    queue.cancel(1, "client_cancelled")
    assert not queue.busy  # now a response.create may go ahead


def test_a_failed_graph_ends_every_response():
    queue = ResponseQueue()
    queue.add(0)
    steps = queue.fail_all()
    assert kinds(steps) == [("finished", 0, "failed", True)] and not queue.busy
    assert queue.fail_all() == []


def test_the_moves_are_explicit_and_finished_states_have_none():
    assert {state for state, _ in MOVES} == {State.QUEUED, State.ACTIVE}
    assert all(target in (State.ACTIVE, *FINISHED) for target in MOVES.values())
    assert MOVES[(State.QUEUED, "open")] is State.ACTIVE and (State.QUEUED, "complete") not in MOVES
    assert State.ACTIVE.value == "in_progress" and State.CANCELLED.value == "cancelled"  # protocol statuses
