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
