"""runtime/output_reuse.py on the CPU: which output array a step gets back, within the budget."""
from __future__ import annotations

import numpy as np

from opplugin.runtime.output_reuse import PreboundOutputs, owns


def test_a_step_gets_back_the_array_of_its_last_run_at_the_same_chunk_size_only():
    kept = PreboundOutputs()
    first = np.empty((4, 8))
    kept.keep(3, 4, first)
    assert kept.get(3, 4) is first
    assert kept.get(3, 2) is None and kept.get(2, 4) is None
    kept.keep(3, 2, np.empty((2, 8)))  # another chunk size replaces it
    assert kept.get(3, 4) is None and kept.nbytes == 2 * 8 * 8


def test_arrays_past_the_budget_are_not_kept():
    kept = PreboundOutputs(budget_bytes=1000)
    kept.keep(0, 1, np.empty(100))  # 800 bytes
    kept.keep(1, 1, np.empty(100))  # would make 1600
    assert kept.get(0, 1) is not None and kept.get(1, 1) is None and kept.nbytes == 800
    kept.drop(0)
    assert kept.nbytes == 0
    kept.keep(1, 1, np.empty(100))
    kept.clear()
    assert kept.get(1, 1) is None and kept.nbytes == 0


def test_only_an_array_the_kernel_allocated_is_kept_for_the_next_run():
    x = np.ones((4, 8), np.float32)
    assert owns(np.empty((4, 8)), [x])
    assert not owns(x[:2], [x])  # a view of the input (a Slice along the batch): not the step's memory
    assert not owns(x, [x])  # the input itself, handed on
