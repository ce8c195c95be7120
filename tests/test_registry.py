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
    assert swapped == ["conv1", "relu1", "pool1", "conv2", "relu2", "flatten", "fc"]
    assert {s.name: s.implementation for s in runner.describe().steps}["relu1"] == "relu.example"
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


def test_a_kernel_need_not_say_whether_it_replays():
    """The members read with getattr (out_view, in_views, replayable) are not asked of a kernel
    that does not subclass Kernel: a plugin written before them keeps working."""

    class Doubling:  # every Protocol member, none of the optional ones
        name, variant, nonfinite_exact, device_work = "double", None, True, True

        def flops(self, batch):
            return batch

        def bytes_moved(self, batch):
            return 8 * batch

        def workspace_bytes(self, batch):
            return 0

        def __call__(self, inputs, stream=None):
            return [inputs[0] * 2]

    kernel = Doubling()
    assert isinstance(kernel, registry.Kernel) and not getattr(kernel, "replayable", False)
