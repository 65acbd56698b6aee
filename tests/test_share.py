"""How a worker's graph codegen splits its kernel misses between siblings and its own threads
(``scheduler/share.py``), on the class alone; the same through a real worker is in
test_cluster.py."""

from __future__ import annotations

import threading

import pytest

from compileq.scheduler.share import Share


class Recorder:
    """The two ways out, recorded; ``share`` is what the siblings have room for, changed live."""

    def __init__(self, share: int) -> None:
        self.share = share
        self.sent: list[int] = []
        self.built: list[int] = []

    def make(self, local_slots: int) -> Share[int]:
        return Share(lambda: self.share, local_slots, self.sent.extend, self.built.extend)


def test_misses_go_to_siblings_up_to_the_share_then_to_local_threads_and_the_rest_wait() -> None:
    out = Recorder(share=3)
    share = out.make(local_slots=2)
    share.add(list(range(10)))
    assert (out.sent, out.built) == ([0, 1, 2], [3, 4])
    assert share.counts == (5, 3, 2)


def test_whichever_frees_first_takes_the_next_waiting_miss() -> None:
    out = Recorder(share=2)
    share = out.make(local_slots=1)
    share.add(list(range(6)))  # 0, 1 sent; 2 built; 3, 4, 5 wait
    share.done(0)  # a sibling's build came back: the next goes to a sibling
    assert share.settled(10) and out.sent == [0, 1, 3]
    share.done(2)  # the local build ended: the next is built here
    assert share.settled(10) and out.built == [2, 4]
    out.share = 0  # every sibling is generating now: only local threads take more
    share.done(1)
    assert share.settled(10) and out.sent == [0, 1, 3] and share.counts == (1, 1, 1)
    share.done(4)
    assert share.settled(10) and out.built == [2, 4, 5] and share.counts == (0, 1, 1)


def test_a_small_batch_on_a_large_worker_goes_wholly_to_its_idle_siblings() -> None:
    out = Recorder(share=30)
    out.make(local_slots=4).add(list(range(12)))
    assert (out.sent, out.built) == (list(range(12)), [])


def test_an_item_ended_twice_or_never_handed_out_frees_nothing() -> None:
    out = Recorder(share=1)
    share = out.make(local_slots=1)
    share.add([1, 2, 3])
    share.done(99)  # never added
    share.done(3)  # still waiting: not handed out yet
    assert share.counts == (1, 1, 1)
    share.done(1)
    share.done(1)  # again: the room it freed is given once
    assert share.settled(10) and out.sent == [1, 3] and share.counts == (0, 1, 1)


def test_concurrent_ends_hand_out_every_miss_exactly_once() -> None:
    out = Recorder(share=4)
    share = out.make(local_slots=4)
    share.add(list(range(500)))
    handed = threading.Lock()

    def finish() -> None:
        while True:
            with handed:
                done = [i for i in out.sent + out.built if i not in finished]
                finished.update(done)
            if not done:
                if len(finished) == 500:
                    return
                continue
            for i in done:
                share.done(i)

    finished: set[int] = set()
    threads = [threading.Thread(target=finish) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert share.settled(10)
    assert sorted(out.sent + out.built) == list(range(500))
    assert share.counts == (0, 0, 0)


def test_what_an_end_frees_is_handed_out_on_the_shares_own_thread_not_the_enders() -> None:
    # The ender is the client's listener or the reader thread of Inductor's compile pool,
    # neither of which should do a send's or a submit's work (scheduler/share.py).
    threads: list[str] = []
    share: Share[int] = Share(
        lambda: 0, 1, print, lambda items: threads.append(threading.current_thread().name)
    )
    share.add([1, 2, 3])
    for item in (1, 2):
        share.done(item)
        assert share.settled(10)
    assert threads == ["MainThread", "compileq-share", "compileq-share"]


def test_a_share_without_local_threads_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Share(lambda: 1, 0, print, print)
