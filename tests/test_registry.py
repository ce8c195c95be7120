"""The plugin registry: built-in Conv, the API, and the entry-point group."""
from importlib.metadata import EntryPoint

import numpy as np
import onnxruntime as ort
import pytest

from example_plugin import ReluPlugin
from opplugin import registry
from opplugin.errors import PluginError
from opplugin.graph.model import load_model
from opplugin.plan.partition import PluginStep
from opplugin.runtime import Runner


@pytest.fixture
def clean_registry():
    saved = dict(registry._registry), registry._entry_points_loaded
    yield
    registry._registry.clear()
    registry._registry.update(saved[0])
    registry._entry_points_loaded = saved[1]


def test_conv_is_built_in():
    assert registry.plugin_for("Conv").op_type == "Conv"


def test_a_registered_plugin_takes_its_nodes(clean_registry, tiny_model_path):
    registry.register(ReluPlugin(), replace=True)  # in the place of the built-in pointwise Relu
    runner = Runner(load_model(tiny_model_path), 3, "cpu")
    swapped = [s.name for s in runner.plan.steps if isinstance(s, PluginStep)]
    # the user's Relu stops the Conv > Relu > MaxPool fusion; the MaxPool then runs as the built-in pool plugin's step
    assert swapped == ["conv1", "relu1", "pool1", "conv2", "relu2", "fc"]  # fc reads the Flatten as a view
    assert {s.name: s.implementation for s in runner.plan_record().steps}["relu1"] == "relu.example"
    x = np.random.default_rng(2).standard_normal((3, 3, 12, 12)).astype(np.float32)
    expected = ort.InferenceSession(tiny_model_path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(runner.run({"x": x}).outputs["y"], expected, rtol=1e-5, atol=1e-6)


def test_registering_twice_needs_replace(clean_registry):
    registry.plugins()  # the built-ins, Relu among them
    with pytest.raises(PluginError, match="already registered"):
        registry.register(ReluPlugin())
    registry.register(ReluPlugin(), replace=True)
    with pytest.raises(PluginError, match="already registered"):
        registry.register(ReluPlugin())
    registry.register(ReluPlugin(), replace=True)


def test_objects_that_are_not_plugins_are_refused():
    with pytest.raises(TypeError, match="not a Plugin instance"):
        registry.register(object())


def test_entry_point_group_is_loaded(clean_registry, monkeypatch):
    point = EntryPoint(name="relu", value="example_plugin:ReluPlugin", group="opplugin.plugins")
    monkeypatch.setattr(registry, "entry_points", lambda group: [point] if group == "opplugin.plugins" else [])
    registry._entry_points_loaded = False
    registry.unregister("Relu")
    assert isinstance(registry.plugins()["Relu"], ReluPlugin)


class Doubling:
    """A kernel with every member of the protocol, without subclassing it."""

    name, variant, nonfinite_exact, device_work = "double", None, True, True
    out_view, input_slices, in_views, replayable, flags_nonfinite = "", None, False, False, False

    def flops(self, batch):
        return batch

    def bytes_moved(self, batch):
        return 8 * batch

    def workspace_bytes(self, batch):
        return 0

    def copying(self, positions):
        return None

    def __call__(self, inputs, stream=None):
        return [inputs[0] * 2]


def without(cls: type, member: str) -> type:
    """`cls` less one of its members."""
    return type(cls.__name__, (), {name: value for name, value in vars(cls).items() if name != member})


def test_a_kernel_that_does_not_subclass_kernel_has_every_member_the_runner_lists():
    assert isinstance(Doubling(), registry.Kernel)
    for member in registry.KERNEL_MEMBERS:  # each one is asked for, and the list names them all
        assert not isinstance(without(Doubling, member)(), registry.Kernel), member
    assert set(registry.KERNEL_MEMBERS) == {name for name in vars(Doubling) if not name.startswith("__")} | {"__call__"}


class OldStyleRelu(ReluPlugin):
    """Builds a kernel written before the protocol declared out_view, in_views and the rest."""

    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        return without(Doubling, "replayable")()


def test_a_kernel_short_of_a_member_is_refused_with_the_list_of_what_it_needs(tiny_model_path):
    with pytest.raises(PluginError, match=r"which is not a Kernel \(it needs name, variant, .*replayable.*copying, __call__"):
        Runner(load_model(tiny_model_path), 3, "cpu", registry=registry.plugins() | {"Relu": OldStyleRelu()})


class Identity:
    """A plugin with every member of the protocol, without subclassing it."""

    op_type, group_kind, prologue_input, empty_tensors = "Identity", None, None, False

    def supports(self, node, device):
        return None

    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        return Doubling()

    def make_spec(self, node):
        return None

    def kernel_name(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        return None

    def compile_jobs(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        return ()

    def fuse(self, node, followers, device):
        return 0

    def fuse_prologue(self, node, chain, data, device):
        return False

    def variant_notes(self, node, device):
        return {}

    def nonfinite_exact_variant(self, node, device):
        return None

    def precision_variant(self, node, device, precision, fused=(), prologue=()):
        return registry.PrecisionChoice(None, "no kernel in it")

    def variant_precision(self, node, device, variant):
        return "fp32"

    def channel_last(self, node, device, variant, fused=(), prologue=()):
        return None

    def linked_variant(self, node, device, variant, inputs, output, format, fused=(), prologue=()):
        raise AssertionError("never asked: channel_last offers nothing")

    def view_of(self, node, output):
        return None

    def reads_views(self, node, fused):
        return False


def test_a_plugin_that_does_not_subclass_plugin_has_every_member_register_lists():
    assert isinstance(Identity(), registry.Plugin)
    for member in registry.PLUGIN_MEMBERS:
        assert not isinstance(without(Identity, member)(), registry.Plugin), member
    assert set(registry.PLUGIN_MEMBERS) == {name for name in vars(Identity) if not name.startswith("__")}
    with pytest.raises(TypeError, match=", ".join(registry.PLUGIN_MEMBERS)):
        registry.register(without(Identity, "compile_jobs")())
