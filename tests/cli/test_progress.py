"""The progress bar: in place on a terminal, plain quarter lines in a log, nothing for short
runs; and the lines it gives run's and check's logs."""
import io
import json

from opplugin.cli import main
from opplugin.cli.progress import ProgressBar


class _Terminal(io.StringIO):
    def isatty(self):
        return True


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_terminal_gets_a_bar_redrawn_in_place_for_long_runs():
    stream, clock = _Terminal(), _Clock()
    bar = ProgressBar(stream, clock=clock)
    clock.now = 1.0
    bar("timed run", 500, 1000)
    clock.now = 2.0
    bar("timed run", 1000, 1000)
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n")
    assert "50.0%" in text and "100.0%" in text and "1,000/1,000 images" in text and "images/s" in text


def test_a_terminal_gets_nothing_for_a_short_run():
    stream, clock = _Terminal(), _Clock()
    bar = ProgressBar(stream, clock=clock)
    clock.now = 0.1
    bar("run", 10, 10)
    assert stream.getvalue() == ""


def test_a_log_gets_plain_quarter_lines_only_when_asked():
    quiet, chatty, clock = io.StringIO(), io.StringIO(), _Clock()
    for stream, plain in ((quiet, False), (chatty, True)):
        bar = ProgressBar(stream, plain_lines=plain, clock=clock)
        for done in range(0, 1001, 100):
            clock.now += 0.2  # two seconds in all: too short to report unasked
            bar("timed run", done, 1000)
        bar.close()
    assert quiet.getvalue() == ""
    lines = chatty.getvalue().splitlines()
    # a line as each quarter is passed, giving the share of images actually done
    assert [line.split()[1] for line in lines] == ["30%", "50%", "80%", "100%"]
    assert "(300/1,000 images" in lines[0]
    assert "\r" not in chatty.getvalue()


def test_close_ends_a_bar_left_mid_line():
    stream, clock = _Terminal(), _Clock()
    bar = ProgressBar(stream, clock=clock)
    clock.now = 1.0
    bar("run", 3, 10)
    bar.close()
    assert stream.getvalue().endswith("\n")


def test_a_log_gets_quarter_lines_unasked_once_the_work_has_gone_on_for_a_while():
    stream, clock = io.StringIO(), _Clock()
    bar = ProgressBar(stream, clock=clock)
    for done in range(0, 1001, 100):
        clock.now += 1.0  # 10 s in all: the quarters reached after 5 s get a line
        bar("run", done, 1000)
    lines = stream.getvalue().splitlines()
    # nothing in the first five seconds (400 images), then the quarters as they pass
    images = [int(line.split("(")[1].split("/")[0].replace(",", "")) for line in lines]
    assert len(lines) >= 3 and min(images) >= 400 and images[-1] == 1000, lines


def test_a_jump_over_quarters_gives_one_line_whose_share_matches_its_count():
    stream, clock = io.StringIO(), _Clock()
    bar = ProgressBar(stream, plain_lines=True, clock=clock)
    for done in (2405, 4810, 9620, 10000):  # check passes of 2,405 images: the second ends at 48%
        clock.now += 1
        bar("check", done, 10000)
    assert [line.split()[1:3] for line in stream.getvalue().splitlines()] == [
        ["48%", "(4,810/10,000"], ["96%", "(9,620/10,000"], ["100%", "(10,000/10,000"]]


# --- in run's and check's logs ----------------------------------------------------------


def test_run_any_batch_of_random_data_in_chunks_with_progress_in_the_log(tiny_model_path, tmp_path, capsys):
    code = main(["run", tiny_model_path, "--batch", "30000", "--data", "random", "--device", "cpu", "--repeat", "1",
                 "--chunk", "400", "--json", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["batch"] == 30000 and data["chunks"] == 75 and data["images_per_s"] > 0
    assert data["agreement"]["passed"]
    assert "Host to host:" in out and "images/s" in out
    # stderr is not a terminal here: a plain line per quarter, no carriage returns
    assert _progress_shares(err) == ["25%", "50%", "76%", "100%"]
    assert "\r" not in err


def _progress_shares(err: str) -> list[str]:
    """The shares of the plain progress lines in `err`, each checked against the image count beside it."""
    shares = []
    for line in err.splitlines():
        if line.startswith("progress:"):
            share, counts = line.split()[1:3]
            done, total = (int(n.replace(",", "")) for n in counts.strip("(").split("/"))
            assert share == f"{100 * done // total}%", line
            shares.append(share)
    return shares


def test_a_short_run_prints_no_progress(capsys):
    assert main(["run", "ece408_high", "--batch", "20", "--device", "cpu", "--repeat", "1", "--no-compare"]) == 0
    assert "progress" not in capsys.readouterr().err


def test_check_of_a_large_batch_is_compared_in_passes_with_progress(tiny_model_path, tmp_path, capsys):
    code = main(["check", tiny_model_path, "--batch", "30", "--data", "random", "--device", "cpu",
                 "--check-chunk", "7", "--json", str(tmp_path / "c.json")])
    out, err = capsys.readouterr()
    assert code == 0 and "PASS" in out
    assert "Compared in 5 passes of up to 7 images" in out
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["passed"] and data["check_chunks"] == 5 and data["check_chunk_size"] == 7
    assert all(r["elements"] > 0 for r in data["records"])
    # passes of 7 of 30 images: the lines come after passes 2 to 5, and say how far each got
    assert _progress_shares(err) == ["46%", "70%", "93%", "100%"]


def test_check_in_one_pass_prints_no_progress(capsys):
    assert main(["check", "ece408_high", "--batch", "20", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "passes" not in out and "progress" not in err
