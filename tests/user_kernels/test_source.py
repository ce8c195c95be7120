"""A kernel file's name in the source NVRTC compiles: quoted as C quotes it in the #line
directive, so NVRTC's messages name the file and its lines whatever the name holds; a name
with a control character, which no one-line message can show, refused in one line."""
from __future__ import annotations

import pytest
from user_kernel_fixtures import edited, new_starter

from opplugin.cli import main
from opplugin.gpu import nvrtc
from opplugin.user_kernels import KernelSource, UserKernelError
from opplugin.user_kernels.source import c_string

needs_nvrtc = pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="NVRTC (cuda-bindings) is not installed")


def test_a_name_is_quoted_as_a_c_string():
    assert c_string('plain.cu') == '"plain.cu"'
    assert c_string('a"b\\c.cu') == '"a\\"b\\\\c.cu"'
    assert c_string("x\n1\x7f.cu") == '"x\\0121\\177.cu"'  # three octal digits: the 1 after it stays a 1


@pytest.mark.parametrize("name, shown", [("a\nb.cu", "a\\nb.cu"), ("a\rb.cu", "a\\rb.cu"), ("c1\x85.cu", "c1\\x85.cu")])
def test_a_name_with_a_control_character_is_refused_in_one_line(name, shown, tmp_path):
    path = new_starter(tmp_path).rename(tmp_path / name)
    with pytest.raises(UserKernelError) as info:
        KernelSource(str(path), "Conv")
    assert str(info.value) == f"{tmp_path}/{shown}: a kernel file's name must not hold a control character (a newline, a tab ...); rename the file"


@needs_nvrtc
def test_a_compile_error_in_a_file_with_quotes_and_backslashes_in_its_name_is_at_its_line(tmp_path, capsys):
    starter = new_starter(tmp_path)
    bad = edited(starter, "acc += b[m];", "acc += b[m] + oops;", 'my "odd\\ kernel.cu')
    assert main(["plan", "lenet86", "--device", "cpu", "--kernel", f"Conv={bad}"]) == 2
    line = next(n for n, text in enumerate(bad.read_text().splitlines(), 1) if "oops" in text)
    _, err = capsys.readouterr()
    assert err.splitlines()[0] == f'{bad}:{line}: identifier "oops" is undefined'
    assert f'my "odd\\ kernel.cu({line}): error: identifier "oops" is undefined' in err  # NVRTC's own log names it too
