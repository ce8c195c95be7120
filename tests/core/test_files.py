"""Report files: written atomically with the umask's permissions; checked before any work."""
import os
import stat

import pytest

from opplugin.errors import InputError
from opplugin.core.files import check_writable, write_atomic


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
