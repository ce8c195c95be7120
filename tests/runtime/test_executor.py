"""ChunkScheduler's hand-out, which needs no device: lane k takes chunks k, k + n, ...; the
calling thread is lane 0's; an error stops the hand-out and comes out once every lane is done."""
from __future__ import annotations

import contextlib
import threading

import pytest

from opplugin.runtime.executor import ChunkScheduler
from opplugin.core.row_ranges import split_rows


class _Lane:
    def __init__(self, index: int):
        self.index = index

    def activate(self):
        return contextlib.nullcontext()


def test_lane_k_takes_every_nth_chunk_and_the_calling_thread_is_lane_0():
    lanes = [_Lane(k) for k in range(3)]
    ran: dict[int, tuple[int, int]] = {}  # chunk -> (lane, thread)
    lock = threading.Lock()

    def work(lane, index, rows):
        with lock:
            ran[index] = (lane.index, threading.get_ident())

    ChunkScheduler(lanes).run(split_rows(70, 10), work)
    assert {index: lane for index, (lane, _) in ran.items()} == {i: i % 3 for i in range(7)}
    threads = {lane: {thread for index, (k, thread) in ran.items() if k == lane} for lane in range(3)}
    assert threads[0] == {threading.get_ident()}  # the first chunk starts with no hand-over
    assert all(len(found) == 1 and threading.get_ident() not in found for found in (threads[1], threads[2]))


def test_an_error_on_the_calling_threads_lane_comes_out_after_the_other_lanes_finish():
    lanes = [_Lane(k) for k in range(2)]
    finished = []
    lane_1_started = threading.Event()

    def work(lane, index, rows):
        if index == 0:
            lane_1_started.wait(5.0)  # fail while lane 1 works on its chunk
            raise ValueError("chunk 0 failed")
        lane_1_started.set()
        finished.append(index)

    with pytest.raises(ValueError, match="chunk 0 failed"):
        ChunkScheduler(lanes).run(split_rows(40, 10), work)
    assert 1 in finished and 0 not in finished  # lane 1 finished the chunk it had; lane 0 took no more
    assert 2 not in finished
