"""Where the checkout's top-level folders are, for tests that read them (the README, tools/, pyproject.toml)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
