"""`opplugin profile` on a machine without a GPU: it says in one line that it needs one, and picks
its steps (named by step or node, else the slowest plugin steps) from a plan's record."""
import pytest

from opplugin.cli import main
from opplugin.cli.profile import chosen_steps
from opplugin.errors import InputError
from opplugin.graph.model import load_model
from opplugin.runtime import Runner


def test_profile_says_it_needs_a_gpu(capsys):
    assert main(["profile", "lenet86", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == ("opplugin: error: profiling reads a GPU's counters, and there is no CUDA device here "
                                       "(plan and run work on the CPU)\n")


def test_steps_are_named_by_step_or_node_else_the_slowest_plugin_steps():
    record = Runner(load_model("lenet86"), 2, "cpu").plan_record()
    names = [s.name for s in record.steps]
    assert chosen_steps(record, ("pool2", "conv1"), 3, {}) == [names.index("conv1"), names.index("conv2")]  # pool2 is in conv2
    medians = {"conv1": 0.5, "conv2": 2.0, "flatten": 0.01, "fc1": 0.3, "fc2": 0.02}
    assert chosen_steps(record, (), 2, medians) == [names.index("conv1"), names.index("conv2")]
    with pytest.raises(InputError, match="--step conv9: no step or node of that name"):
        chosen_steps(record, ("conv9",), 3, medians)


def test_step_and_top_together_are_refused(capsys):
    assert main(["profile", "--step", "conv1", "--top", "5"]) == 2
    assert "--step names the steps, --top picks the slowest; give one" in capsys.readouterr().err
