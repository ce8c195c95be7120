"""A batch of named columns (Ray Data's numpy batches) read as a model's inputs, without Ray:
the column named after an input, or for a model of one input a lone column of any name
(Ray's own `data`); each bad batch one InputError line."""
from __future__ import annotations

import numpy as np
import pytest

from opplugin.errors import InputError
from opplugin.inputs.columns import BatchColumns

LENET = BatchColumns("lenet86", {"input": (64, 1, 86, 86)}, frozenset({"input"}), ("id",))
TWO = BatchColumns("two", {"a": (8, 4), "b": (8, 4)}, frozenset({"a", "b"}))


def images(rows: int = 2, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(rows).random((rows, 1, 86, 86)).astype(dtype)


@pytest.mark.parametrize("column", ["data", "item", "input"])
def test_a_one_input_model_takes_a_lone_column_whatever_its_name(column):
    x = images()
    feeds = LENET.feeds({column: x, "id": np.arange(2)})
    assert list(feeds) == ["input"] and feeds["input"] is x
    assert LENET.sources({column: x}) == {"input": column}


def test_the_column_named_after_the_input_wins_over_the_others():
    x, other = images(), images(3)
    assert LENET.feeds({"data": other, "input": x, "id": np.arange(2)})["input"] is x


def test_pass_through_columns_ride_along_and_are_never_taken_for_the_input():
    x = images()
    assert np.array_equal(LENET.carried({"data": x, "id": np.arange(2)}, rows=2)["id"], np.arange(2))
    with pytest.raises(InputError) as caught:
        LENET.feeds({"id": np.zeros((2, 1, 86, 86), np.float32)})
    assert str(caught.value) == ("the batch has no column 'input' (an input of lenet86); its columns are 'id' "
                                 "(Dataset.rename_columns renames one)")


def test_a_model_of_two_inputs_takes_its_columns_by_name_only():
    a, b = np.ones((3, 4), np.float32), np.zeros((3, 4), np.float32)
    feeds = TWO.feeds({"b": b, "a": a})
    assert feeds["a"] is a and feeds["b"] is b
    with pytest.raises(InputError, match="^the batch has no column 'a' \\(an input of two\\); its columns are 'data'"):
        TWO.feeds({"data": a})


@pytest.mark.parametrize("columns, batch, message", [
    (LENET, {"data": images(), "pixels": images(), "id": np.arange(2)},
     "the batch has no column 'input' (lenet86's one input), and more than one other column could take its place: "
     "'data', 'pixels' (Dataset.rename_columns renames one)"),
    (LENET, {}, "the batch has no column 'input' (an input of lenet86); its columns are none"),
    (LENET, [images()], "Predictor takes batches as a dict of numpy arrays, got list"),
    (LENET, {"data": images(dtype=np.float64)}, "column 'data' (input 'input') is float64; lenet86 takes float32"),
    (LENET, {"input": images(dtype=np.float64)}, "column 'input' is float64; lenet86 takes float32"),
    (LENET, {"data": np.ones((2, 1, 28, 28), np.float32)},
     "column 'data' (input 'input') has shape [2, 1, 28, 28]; lenet86 takes [N, 1, 86, 86]"),
    (LENET, {"data": np.array([np.ones(3), np.ones(4)], dtype=object)},
     "column 'data' (input 'input') holds arrays of different shapes (numpy dtype object); lenet86 takes one shape, [N, 1, 86, 86]"),
    (LENET, {"data": [[0.0]]}, "column 'data' (input 'input') is a list, not a numpy array"),
])
def test_a_bad_batch_is_one_input_error(columns, batch, message):
    with pytest.raises(InputError) as caught:
        columns.feeds(batch)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_pass_through_columns_must_be_there_and_have_the_inputs_rows():
    with pytest.raises(InputError, match="^the batch has no column 'id' \\(a pass_through column of lenet86\\)"):
        LENET.carried({"data": images()}, rows=2)
    with pytest.raises(InputError, match="^column 'id' has 3 rows; the batch's inputs have 2$"):
        LENET.carried({"data": images(), "id": np.arange(3)}, rows=2)


def test_an_input_the_batch_does_not_split_keeps_its_whole_shape_in_messages():
    fixed = BatchColumns("fixed", {"x": (4, 3)}, frozenset())
    assert fixed.wanted("x") == "[4, 3]"
    x = np.ones((4, 3), np.float32)
    assert fixed.feeds({"x": x})["x"] is x
