"""PeerLiveness: who is dead, from probe outcomes and this server's own clock (no I/O)."""

from __future__ import annotations

import pytest

from waltz_server.liveness import LivenessSettings, PeerLiveness, Probe

S = LivenessSettings(probe_interval_s=0.25, refused_confirm_s=0.5, timeout_s=3.0, rejoin_s=2.0)


def run(view: PeerLiveness, peer: int, probe: Probe, start: float, end: float, step: float = 0.25) -> list[float]:
    """Probe peer every step from start to end (the outcome given), ticking after each; when the view changed."""
    changes = []
    t = start
    while t <= end + 1e-9:
        view.observe(peer, probe, t)
        if view.tick(t):
            changes.append(round(t, 3))
        t += step
    return changes


def fresh(peers: tuple[int, ...] = (2,), me: int = 1) -> PeerLiveness:
    view = PeerLiveness(me, S)
    view.watch((me, *peers), 0.0)
    for peer in peers:
        view.observe(peer, Probe.ANSWERED, 0.0)
    view.tick(0.0)
    return view


def test_a_refused_peer_is_dead_once_refusals_lasted_the_confirmation_window() -> None:
    view = fresh()
    changes = run(view, 2, Probe.REFUSED, 0.25, 2.0)
    assert changes == [0.75]  # first refusal at 0.25, confirmed 0.5 s later: well within a second of the kill
    assert view.dead() == {2}


def test_a_single_refusal_between_answers_is_no_death() -> None:
    view = fresh()
    for t in (0.25, 0.5, 0.75, 1.0, 1.25):
        view.observe(2, Probe.REFUSED if t == 0.5 else Probe.ANSWERED, t)
        assert not view.tick(t)
    view.observe(2, Probe.REFUSED, 1.5)
    assert not view.tick(2.0)  # one refusal, 0.5 s old: twice is required
    assert view.dead() == frozenset()


def test_a_silent_peer_is_dead_after_the_timeout_not_before() -> None:
    view = fresh()
    changes = run(view, 2, Probe.UNANSWERED, 0.25, 5.0)
    assert changes == [3.0]


def test_a_one_second_pause_of_a_peer_costs_nothing() -> None:
    view = fresh()
    assert run(view, 2, Probe.UNANSWERED, 0.25, 1.25) == []
    assert run(view, 2, Probe.ANSWERED, 1.5, 60.0) == []
    assert view.dead() == frozenset()


def test_a_slow_but_answering_peer_stays_alive() -> None:
    """Answers that arrive 2.5 s apart (a loaded peer): never 3 s without one."""
    view = fresh()
    for t in (x * 0.25 for x in range(1, 400)):
        if abs(t / 2.5 - round(t / 2.5)) < 1e-9:
            view.observe(2, Probe.ANSWERED, t)
        else:
            view.observe(2, Probe.UNANSWERED, t)
        assert not view.tick(t)


def test_this_servers_own_pause_does_not_kill_its_peers_and_asks_for_a_look_after_rejoin() -> None:
    view = fresh()
    run(view, 2, Probe.ANSWERED, 0.25, 1.0)
    # stopped from 1.0 to 11.0: the probes sent before the pause all time out as the process resumes
    view.observe(2, Probe.UNANSWERED, 11.0)
    assert not view.tick(11.0)
    assert view.stalls == 1
    assert run(view, 2, Probe.ANSWERED, 11.25, 12.75) == []
    assert run(view, 2, Probe.ANSWERED, 13.0, 14.0) == [13.0]  # the resync, rejoin_s after the stall
    assert view.dead() == frozenset()


def test_peers_silent_through_our_pause_still_die_if_they_stay_silent() -> None:
    view = fresh()
    view.tick(10.0)  # a stall
    assert run(view, 2, Probe.UNANSWERED, 10.25, 12.75) == [12.0]  # the resync only
    assert run(view, 2, Probe.UNANSWERED, 13.0, 13.0) == [13.0]  # 3 s of silence counted from the stall
    assert view.dead() == {2}


def test_a_dead_peer_comes_back_after_answering_for_the_rejoin_window() -> None:
    view = fresh()
    run(view, 2, Probe.REFUSED, 0.25, 1.0)
    assert view.dead() == {2}
    assert run(view, 2, Probe.ANSWERED, 1.25, 2.75) == []  # answering, but not for 2 s yet
    view.observe(2, Probe.UNANSWERED, 3.0)  # a miss restarts the window
    view.tick(3.0)
    assert run(view, 2, Probe.ANSWERED, 3.25, 5.0) == []
    assert run(view, 2, Probe.ANSWERED, 5.25, 5.25) == [5.25]
    assert view.dead() == frozenset()


def test_a_peer_never_heard_from_is_not_judged() -> None:
    view = PeerLiveness(1, S)
    view.watch((1, 2), 0.0)
    assert run(view, 2, Probe.REFUSED, 0.25, 10.0) == []
    assert view.dead() == frozenset()


def test_the_coordinator_is_the_smallest_live_id_and_never_this_server_dead() -> None:
    view = fresh(peers=(1, 3), me=2)
    assert view.coordinator([1, 2, 3]) == 1
    run(view, 1, Probe.REFUSED, 0.25, 1.0)
    assert view.dead() == {1}
    assert view.alive([1, 2, 3]) == [2, 3]
    assert view.coordinator([1, 2, 3]) == 2  # the dead coordinator's place is taken at once
    assert view.coordinator([3]) == 3


def test_servers_that_left_zookeeper_are_forgotten_and_new_ones_start_alive() -> None:
    view = fresh(peers=(2, 3))
    run(view, 2, Probe.REFUSED, 0.25, 1.0)
    view.watch([1, 3], 1.0)  # 2's session expired
    assert view.dead() == frozenset()
    view.watch([1, 2, 3], 1.0)  # a server registering under an old id (not done by servers, but harmless)
    assert view.dead() == frozenset()
    view.observe(4, Probe.REFUSED, 1.0)  # not watched: ignored
    assert view.dead() == frozenset()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout_s": 0.0},
        {"refused_confirm_s": 3.0, "timeout_s": 3.0},
        {"probe_interval_s": 0.3, "refused_confirm_s": 0.5},
    ],
)
def test_settings_refuse_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LivenessSettings(**kwargs)


def test_probe_outcomes_from_grpc_status_codes() -> None:
    import grpc

    from waltz_server.peers import outcome

    def error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "x")

    assert outcome(None) is Probe.ANSWERED
    assert outcome(error(grpc.StatusCode.UNAVAILABLE)) is Probe.REFUSED
    assert outcome(error(grpc.StatusCode.DEADLINE_EXCEEDED)) is Probe.UNANSWERED
    assert outcome(error(grpc.StatusCode.UNIMPLEMENTED)) is Probe.ANSWERED  # its server answered
    assert outcome(error(grpc.StatusCode.NOT_FOUND)) is Probe.OTHER  # no such server id there: another process


# A peer is an incarnation, not an address: every case of a new process on a registered server's address.


def test_a_new_process_answering_at_a_killed_peers_address_makes_it_dead_at_once() -> None:
    view = fresh()
    view.observe(2, Probe.REFUSED, 0.25)  # killed: one refusal, not yet confirmed
    view.observe(2, Probe.OTHER, 0.3)  # restarted under a new id on the same address
    assert view.tick(0.3)
    assert view.dead() == {2}


def test_a_dead_peer_never_rejoins_through_a_process_that_took_its_address() -> None:
    view = fresh()
    run(view, 2, Probe.REFUSED, 0.25, 1.0)
    assert view.dead() == {2}
    assert run(view, 2, Probe.OTHER, 1.25, 30.0) == []  # answered all along, by another process
    assert view.dead() == {2}
    assert view.coordinator([1, 2]) == 1  # the ghost never coordinates


def test_a_replaced_peer_stays_dead_even_if_an_answer_as_its_id_arrives_late() -> None:
    view = fresh()
    view.observe(2, Probe.OTHER, 0.25)
    view.tick(0.25)
    assert run(view, 2, Probe.ANSWERED, 0.5, 10.0) == []  # a probe that left before the restart: stale
    assert view.dead() == {2}


def test_a_peer_never_heard_from_as_itself_is_not_judged_by_other_answers() -> None:
    """A server of an older release answers NOT_FOUND for its id: a rolling upgrade must not move its partitions.
    (A ghost this server never heard from is deleted from ZooKeeper by the process on its address instead.)"""
    view = PeerLiveness(3, S)
    view.watch((1, 3), 0.0)
    assert run(view, 1, Probe.OTHER, 0.0, 30.0) == []
    assert view.dead() == frozenset()


def test_a_replaced_peer_is_dead_through_this_servers_own_stall() -> None:
    view = fresh()
    view.observe(2, Probe.OTHER, 0.25)
    view.tick(0.25)
    view.tick(10.0)  # this process was paused: every peer's clocks restart
    assert view.dead() == {2}
    assert run(view, 2, Probe.OTHER, 10.25, 13.0) == [12.0]  # only the resync after the stall
    assert view.dead() == {2}


def test_a_peer_registered_again_under_its_id_after_a_session_expiry_is_the_same_incarnation() -> None:
    view = fresh()
    assert run(view, 2, Probe.ANSWERED, 0.25, 5.0) == []
    view.watch((1,), 5.0)  # its session expired: the registration went
    assert run(view, 2, Probe.ANSWERED, 5.25, 6.0) == []
    view.watch((1, 2), 6.0)  # the same process registered again, same id
    assert run(view, 2, Probe.ANSWERED, 6.25, 20.0) == []
    assert view.dead() == frozenset()


def test_the_stale_registrations_are_the_other_ids_on_this_servers_address() -> None:
    from waltz.v1 import metadata_pb2
    from waltz_server.cluster import stale_registrations

    def at(sid: int, host: str, port: int) -> metadata_pb2.ServerDescriptor:
        return metadata_pb2.ServerDescriptor(server_id=sid, host=host, port=port)

    registered = {1: at(1, "h1", 4000), 2: at(2, "h2", 4000), 3: at(3, "h1", 4000), 4: at(4, "h1", 4001)}
    assert stale_registrations(3, "h1", 4000, registered) == [1]  # server 1 was the process before this one
    assert stale_registrations(2, "h2", 4000, registered) == []
    assert stale_registrations(5, "h1", 4000, registered) == [1, 3]


# A registration that vanished with an expired session, while its server still serves as itself.


def test_a_peer_whose_registration_vanished_while_it_serves_stays_live_for_the_grace() -> None:
    """ZooKeeper, woken from a freeze, expired server 2's session but not ours: server 2 serves on and registers
    again within a second; meanwhile the coordinator must not move its partitions (issue 32)."""
    view = fresh()
    run(view, 2, Probe.ANSWERED, 0.25, 1.0)
    view.watch((1,), 1.0)
    assert view.alive([1]) == [1, 2]
    assert run(view, 2, Probe.ANSWERED, 1.25, 2.0) == []
    view.watch((1, 2), 2.0)  # registered again
    assert run(view, 2, Probe.ANSWERED, 2.25, 10.0) == []
    assert view.alive([1, 2]) == [1, 2]


def test_a_departed_peer_that_does_not_register_again_is_dropped_after_the_grace() -> None:
    view = fresh()
    run(view, 2, Probe.ANSWERED, 0.25, 1.0)
    view.watch((1,), 1.0)
    assert run(view, 2, Probe.ANSWERED, 1.25, 5.0) == [4.0]  # timeout_s (3 s) after its registration went
    assert view.alive([1]) == [1] and 2 not in view.watched()


def test_a_peer_stopping_gracefully_is_dropped_as_soon_as_it_answers_not_serving() -> None:
    view = fresh()
    run(view, 2, Probe.ANSWERED, 0.25, 1.0)
    view.watch((1,), 1.0)  # deregistered: the last answer heard was still SERVING
    assert run(view, 2, Probe.LEAVING, 1.25, 2.0) == [1.25]
    assert view.alive([1]) == [1]


def test_a_peer_that_deregistered_while_not_serving_or_refusing_is_forgotten_at_once() -> None:
    view = fresh()
    view.observe(2, Probe.LEAVING, 0.25)
    view.watch((1,), 0.3)
    assert view.alive([1]) == [1] and 2 not in view.watched()
    other = fresh()
    run(other, 2, Probe.ANSWERED, 0.25, 1.0)
    other.watch((1,), 1.0)
    assert run(other, 2, Probe.REFUSED, 1.25, 2.0) == [1.25]  # killed meanwhile
    assert other.alive([1]) == [1]


def test_probe_outcome_of_a_not_serving_answer_is_leaving() -> None:
    from waltz_server.peers import outcome

    assert outcome(None, serving=False) is Probe.LEAVING
