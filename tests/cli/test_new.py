"""`opplugin new`: a starter never replaces anything without --force (a dangling link, a file
another `new` wrote a moment ago, an --ops file it reads), writes through a link with
--force, takes any name the file system takes, and refuses a name no compiler message can show."""
from __future__ import annotations

import os
import shutil
import threading

import pytest

import opplugin.cli.new as new_command
from opplugin.cli import main
from opplugin.user_kernels import starter_text
from repository import ROOT


def one_line_error(capsys, message: str) -> None:
    _, err = capsys.readouterr()
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_a_dangling_link_is_an_existing_name(tmp_path, capsys):
    link = tmp_path / "dl.cu"
    link.symlink_to("nowhere.cu")
    assert main(["new", "conv", str(link)]) == 2
    one_line_error(capsys, f"{link} exists; pass --force to overwrite it")
    assert os.readlink(link) == "nowhere.cu" and [p.name for p in tmp_path.iterdir()] == ["dl.cu"]
    assert main(["new", "conv", str(link), "--force"]) == 0  # written through the link, as every output is
    assert os.readlink(link) == "nowhere.cu" and (tmp_path / "nowhere.cu").read_text().startswith("// ")


def test_a_link_to_a_file_is_refused_without_force_and_written_through_with_it(tmp_path, capsys):
    (tmp_path / "mine.cu").write_text("my work")
    (tmp_path / "link.cu").symlink_to("mine.cu")
    assert main(["new", "conv", str(tmp_path / "link.cu")]) == 2
    one_line_error(capsys, "exists; pass --force")
    assert (tmp_path / "mine.cu").read_text() == "my work"
    assert main(["new", "conv", str(tmp_path / "link.cu"), "--force"]) == 0
    assert (tmp_path / "link.cu").is_symlink()
    assert (tmp_path / "mine.cu").read_text() == starter_text("Conv").replace("THIS_FILE.cu", "link.cu")


def test_of_two_news_at_once_one_writes_and_the_other_is_told(tmp_path, monkeypatch, capsys):
    # both have looked and found no file; then both create it at the same moment
    rounds = 20
    start = threading.Barrier(2)
    create = new_command.create_new

    def together(path, text):
        start.wait()
        create(path, text)

    monkeypatch.setattr(new_command, "create_new", together)
    for round_ in range(rounds):
        target = tmp_path / f"k{round_}.cu"
        codes: list[int] = []
        threads = [threading.Thread(target=lambda: codes.append(main(["new", "conv", str(target)]))) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(codes) == [0, 2], (round_, codes)
        assert target.read_text() == starter_text("Conv").replace("THIS_FILE.cu", target.name)
    out, err = capsys.readouterr()
    assert out.count("Wrote ") == rounds
    assert err.count("exists; pass --force to overwrite it") == rounds and "Traceback" not in err
    assert len(list(tmp_path.iterdir())) == rounds  # no temporary file left


def test_a_name_as_long_as_the_file_system_allows(tmp_path, capsys):
    name = "k" * (os.pathconf(tmp_path, "PC_NAME_MAX") - len(".cu")) + ".cu"
    assert main(["new", "conv", str(tmp_path / name)]) == 0
    assert main(["new", "conv", str(tmp_path / name), "--force"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert main(["new", "conv", str(tmp_path / ("k" + name))]) == 2
    one_line_error(capsys, "the name is longer than the file system allows")


@pytest.mark.parametrize("name, shown", [("a\nb.cu", "a\\nb.cu"), ("tab\t.cu", "tab\\t.cu"), ("bell\x07.cu", "bell\\x07.cu")])
def test_a_name_with_a_control_character_is_refused(name, shown, tmp_path, capsys):
    assert main(["new", "conv", str(tmp_path / name)]) == 2
    one_line_error(capsys, f"{tmp_path}/{shown}: a kernel file's name must not hold a control character")
    assert list(tmp_path.iterdir()) == []


def test_the_starter_never_replaces_the_ops_file_it_reads(tmp_path, capsys):
    ops = tmp_path / "ops.py"
    shutil.copy(ROOT / "models" / "lenet86_swish_ops.py", ops)
    shutil.copy(ROOT / "models" / "swish.cu", tmp_path / "swish.cu")
    (tmp_path / "link.py").symlink_to("ops.py")
    before = ops.read_bytes()
    for target in (ops, tmp_path / "link.py"):
        assert main(["new", "example.ops::Swish", str(target), "--ops", str(ops), "--force"]) == 2
        one_line_error(capsys, f"opplugin new example.ops::Swish {target} is the same file as an --ops file, which the command reads")
    assert ops.read_bytes() == before
