"""What the CPU and GPU tests of user kernels share: a fresh starter, and edited copies of it."""
from pathlib import Path

from opplugin.user_kernels import starter_text

FUSED = Path(__file__).parents[1] / "user_kernels" / "conv_fused.cu"


def new_starter(folder: Path) -> Path:
    """The Conv starter, as `opplugin new conv my_conv.cu` writes it, in `folder`."""
    path = folder / "my_conv.cu"
    path.write_text(starter_text("Conv").replace("THIS_FILE.cu", path.name))
    return path


def edited(path: Path, old: str, new: str, name: str) -> Path:
    """A copy of `path` named `name` beside it, with every `old` replaced by `new` (which must be there)."""
    text = path.read_text()
    assert old in text
    target = path.with_name(name)
    target.write_text(text.replace(old, new))
    return target


def watch_through_an_edit(argv: list[str], source: Path, old: str, new: str) -> tuple[int, str]:
    """`check ARGV --watch` for one edit: measured, then `source` edited (`old` to `new`) once the first
    result is out, then measured again. Its exit status and everything it said."""
    import threading
    import time

    from opplugin.cli import check, workload
    from opplugin.cli.commands import build_parser

    options = check.read(build_parser().parse_args(["check", *argv, "--watch"]))
    said: list[str] = []

    def edit_after_first_result():
        while not any("measured:" in line for line in said):
            time.sleep(0.05)
        time.sleep(0.5)
        source.write_text(source.read_text().replace(old, new))

    editor = threading.Thread(target=edit_after_first_result)
    editor.start()
    code = workload.watch(options.workload, options.tolerance, poison=True, cycles=1, say=said.append)
    editor.join()
    return code, "\n".join(said)
