"""CI runs the README's two set-up commands as the README writes them."""
from __future__ import annotations

import re
from repository import ROOT




def readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Set-up: two commands"):]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readme_gives_two_commands_installing_the_cpu_path():
    install, tests = readme_commands()
    assert '".[cpu,dev]"' in install and install.endswith("opplugin run")
    assert tests == "python3 -m pytest -q"


def test_ci_runs_both_commands_as_written():
    ci = (ROOT / ".ci" / "run").read_text()
    lines = [line.strip() for line in ci.splitlines()]
    install, tests = readme_commands()
    assert any(line.endswith(install) for line in lines)
    assert tests in lines
    assert '-eq 5' in ci  # pytest's "no tests collected" fails CI rather than passing it


def test_every_subpackage_ships_in_the_wheel():
    import tomllib

    root = ROOT
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "opplugin").rglob("__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
