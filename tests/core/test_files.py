"""Report files: written atomically with the umask's permissions, through symbolic links, with any name
the file system takes; created without replacing anything; checked before any work."""
import os
import stat
import threading

import pytest

from opplugin.errors import InputError
from opplugin.core.files import check_writable, create_new, write_atomic


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_the_mode_the_umask_gives(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_atomic(tmp_path / "r.json", "{}")
        assert os.umask(umask) == umask  # the umask itself is left as it was
    finally:
        os.umask(old)
    assert _mode(tmp_path / "r.json") == mode
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_replaced_file_keeps_its_own_mode(tmp_path):
    target = tmp_path / "r.csv"
    target.write_text("old")
    target.chmod(0o640)
    write_atomic(target, "new")
    assert target.read_text() == "new" and _mode(target) == 0o640


def test_checking_a_path_creates_and_touches_nothing(tmp_path):
    existing = tmp_path / "old.json"
    existing.write_text("old")
    before = existing.stat().st_mtime_ns
    assert check_writable(str(existing), "--json") == existing
    assert check_writable(str(tmp_path / "new.json"), "--json") == tmp_path / "new.json"
    assert [p.name for p in tmp_path.iterdir()] == ["old.json"]
    assert existing.read_text() == "old" and existing.stat().st_mtime_ns == before


@pytest.mark.parametrize("path, message", [
    ("", "--json needs a file path, got an empty one"),
    ("  ", "--json needs a file path, got an empty one"),
    ("/", "--json / is a folder; give a file path"),
    ("/tmp/no_such_outdir/", "--json /tmp/no_such_outdir/ is a folder; give a file path"),  # not a file named after it
    ("/dev/null", "--json /dev/null is not a regular file; give a file path"),
    ("/proc/r.json", "--json /proc/r.json: cannot create a file in /proc ("),
    ("/no/such/folder/r.json", "--json /no/such/folder/r.json: folder /no/such/folder does not exist"),
    ("/dev/null/r.json", "--json /dev/null/r.json: /dev/null is not a folder"),
])
def test_paths_that_cannot_be_written_are_refused(path, message):
    with pytest.raises(InputError) as info:
        check_writable(path, "--json")
    assert str(info.value).startswith(message)


# --- symbolic links, long names, creating without replacing ---------------------------------


def test_a_symbolic_link_is_written_through_and_kept(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "r.json").write_text("old")
    (elsewhere / "r.json").chmod(0o640)
    (tmp_path / "link.json").symlink_to(elsewhere / "r.json")
    write_atomic(tmp_path / "link.json", "new")
    assert (tmp_path / "link.json").is_symlink() and os.readlink(tmp_path / "link.json") == str(elsewhere / "r.json")
    assert (elsewhere / "r.json").read_text() == "new" and _mode(elsewhere / "r.json") == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "link.json"]  # the temporary file was beside the target
    assert [p.name for p in elsewhere.iterdir()] == ["r.json"]


def test_a_dangling_link_is_written_through_to_the_file_it_names(tmp_path):
    (tmp_path / "link.json").symlink_to("target.json")
    assert check_writable(str(tmp_path / "link.json"), "--json") == tmp_path / "link.json"
    write_atomic(tmp_path / "link.json", "{}")
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "target.json").read_text() == "{}"


def test_links_in_a_circle_are_refused(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(InputError, match="--json .*/a: its symbolic links lead round in a circle"):
        check_writable(str(tmp_path / "a"), "--json")
    with pytest.raises(OSError):
        write_atomic(tmp_path / "a", "x")
    assert os.readlink(tmp_path / "a") == "b"  # the link was not replaced by a file


@pytest.mark.parametrize("through, message", [
    ("/proc/r.json", "cannot create a file in /proc ("),
    ("/no/such/folder/r.json", "folder /no/such/folder does not exist"),
])
def test_a_link_is_checked_where_it_leads(tmp_path, through, message):
    (tmp_path / "link.json").symlink_to(through)
    with pytest.raises(InputError) as info:
        check_writable(str(tmp_path / "link.json"), "--json")
    assert str(info.value).startswith(f"--json {tmp_path / 'link.json'}: {message}")


def test_a_name_as_long_as_the_file_system_allows_is_written(tmp_path):
    longest = os.pathconf(tmp_path, "PC_NAME_MAX")
    name = "r" * (longest - len(".json")) + ".json"
    assert check_writable(str(tmp_path / name), "--json") == tmp_path / name
    write_atomic(tmp_path / name, "{}")
    create_new(tmp_path / ("n" + name[1:]), "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "n" + name[1:]])
    with pytest.raises(InputError) as info:
        check_writable(str(tmp_path / ("r" + name)), "--json")
    assert str(info.value) == f"--json {tmp_path / ('r' + name)}: the name is longer than the file system allows"
    (tmp_path / "link.json").symlink_to("l" + name)  # a link to a name too long
    with pytest.raises(InputError) as info:
        check_writable(str(tmp_path / "link.json"), "--json")
    assert str(info.value) == f"--json {tmp_path / 'link.json'}: the name is longer than the file system allows"


def test_create_new_refuses_any_existing_name_and_leaves_it_as_it_was(tmp_path):
    (tmp_path / "old.cu").write_text("old")
    (tmp_path / "dangling.cu").symlink_to("nowhere.cu")
    for name in ("old.cu", "dangling.cu"):
        with pytest.raises(FileExistsError):
            create_new(tmp_path / name, "new")
    assert (tmp_path / "old.cu").read_text() == "old" and os.readlink(tmp_path / "dangling.cu") == "nowhere.cu"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.cu", "old.cu"]


def test_a_created_file_gets_the_mode_the_umask_gives(tmp_path):
    old = os.umask(0o027)
    try:
        create_new(tmp_path / "k.cu", "text")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "k.cu") == 0o640 and (tmp_path / "k.cu").read_text() == "text"


def test_of_two_writers_creating_one_file_exactly_one_wins(tmp_path):
    writers = 4
    for round_ in range(40):
        target = tmp_path / f"k{round_}.cu"
        start = threading.Barrier(writers)
        won: list[int] = []
        lost: list[int] = []

        def write(who: int) -> None:
            start.wait()
            try:
                create_new(target, f"writer {who}\n" * 1000)
            except FileExistsError:
                lost.append(who)
            else:
                won.append(who)

        threads = [threading.Thread(target=write, args=(who,)) for who in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(won) == 1 and len(lost) == writers - 1, (round_, won, lost)
        assert target.read_text() == f"writer {won[0]}\n" * 1000  # whole, and the winner's
    assert len(list(tmp_path.iterdir())) == 40  # no temporary file left
