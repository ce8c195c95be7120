"""How many devices a run uses (runtime/feeding.py), from given images/s: the fewest within the
margin of the most, never a count that measured slower than a smaller one; when a run is probed;
the JSON record of the choice."""
import pytest

from opplugin.runtime.feeding import FEED_MARGIN, MIN_PROBE_SHARE, Feeding, fed_count, probe_skipped


def test_lenet86_on_four_h200s_uses_three():
    """The issue's figures: 1.77x on 2 GPUs, 1.87x on 3, 1.66x on 4."""
    assert fed_count([1.0, 1.77, 1.87, 1.66]) == 3


def test_one_device_is_one():
    assert fed_count([1234.0]) == 1


def test_a_tie_or_a_gain_within_the_margin_takes_fewer_devices():
    assert fed_count([100.0, 100.0]) == 1
    assert fed_count([100.0, 102.0, 102.5]) == 1  # 2.5% more with 3: within 3%
    assert fed_count([100.0, 181.0, 185.0, 186.0]) == 2  # 186 is 2.8% past 181
    assert fed_count([100.0, 180.0, 185.0, 186.0]) == 3  # 3.3% past 180, 0.5% past 185


def test_a_gain_past_the_margin_takes_the_devices():
    assert fed_count([100.0, 110.0]) == 2
    assert fed_count([100.0, 195.0, 290.0, 385.0]) == 4  # scaling well: every device


def test_the_margin_is_the_callers():
    assert fed_count([100.0, 110.0], margin=0.1) == 1 and fed_count([100.0, 110.0], margin=0.0) == 2


@pytest.mark.parametrize("rates", [[1.0, 1.77, 1.87, 1.66], [100.0, 99.0, 150.0, 140.0, 151.0], [5.0, 4.0, 3.0],
                                   [100.0, 96.0, 101.0, 104.0], [3.0, 1.0, 2.0, 2.95, 3.1]])
def test_no_smaller_count_measured_as_fast_as_the_count_chosen(rates):
    chosen = fed_count(rates)
    assert all(rates[smaller - 1] < rates[chosen - 1] for smaller in range(1, chosen))
    assert rates[chosen - 1] >= max(rates) * (1 - FEED_MARGIN)


def test_no_figures_is_a_bug():
    with pytest.raises(ValueError):
        fed_count([])


def test_a_run_is_probed_when_every_device_gets_enough_images():
    assert probe_skipped(2 * MIN_PROBE_SHARE, 2) is None
    assert probe_skipped(2 * MIN_PROBE_SHARE - 1, 2) == f"the batch gives each device under {MIN_PROBE_SHARE} images"
    assert probe_skipped(10**6, 1) == "one device given"
    assert probe_skipped(10**6, 4, asked=False) == "asked to use every device given"


def test_the_record_names_the_devices_used_and_idle_and_the_figures_behind():
    feeding = Feeding.measured([50_000, 100_000, 150_000, 200_000], [50.0, 56.5, 80.2, 120.5])
    assert feeding.given == 4 and feeding.used == 3 and feeding.skipped is None
    record = feeding.record(["cuda:0", "cuda:1", "cuda:2", "cuda:3"])
    assert record["probed"] is True and record["why_not_probed"] is None and record["margin"] == FEED_MARGIN
    assert record["used"] == ["cuda:0", "cuda:1", "cuda:2"] and record["idle"] == ["cuda:3"]
    assert [(row["devices"], row["images"], row["time_ms"]) for row in record["probe"]] == [
        (1, 50_000, 50.0), (2, 100_000, 56.5), (3, 150_000, 80.2), (4, 200_000, 120.5)]
    assert [row["images_per_s"] for row in record["probe"]] == pytest.approx([1e6, 100_000 / 0.0565, 150_000 / 0.0802, 200_000 / 0.1205])


def test_an_unprobed_run_uses_every_device_and_says_why():
    record = Feeding.unprobed(2, "one device given").record(["cpu #1", "cpu #2"])
    assert record == {"probed": False, "given": ["cpu #1", "cpu #2"], "used": ["cpu #1", "cpu #2"], "idle": [],
                      "why_not_probed": "one device given", "margin": FEED_MARGIN, "probe": []}
