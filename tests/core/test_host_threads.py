"""Host work over threads: the pieces cover the range, an empty range too (a tensor with an axis of size 0)."""
import numpy as np

from opplugin.core import host_threads


def test_pieces_cover_the_range_and_an_empty_one_is_one_empty_piece():
    assert host_threads.pieces(0, 4) == [slice(0, 0)]
    parts = host_threads.pieces(10, 1 << 30)
    assert parts[0].start == 0 and parts[-1].stop == 10 and all(a.stop == b.start for a, b in zip(parts, parts[1:]))
    seen = []
    host_threads.for_pieces(0, 4, seen.append)
    assert seen == [slice(0, 0)]
    empty = np.empty((3, 0), np.float32)
    host_threads.copy(empty, np.ones((3, 0), np.float32))
    assert empty.shape == (3, 0)
