"""The README's Python example works as written (with the folder path pointed at the installed example)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from .conftest import REPO
from .processes import run_to_completion

pytestmark = [pytest.mark.nemo_gym, pytest.mark.usefixtures("clean_env")]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.DOTALL)


def test_the_create_app_example_prints_reward_one(gym_root: Path, tmp_path: Path) -> None:
    (block,) = [b for b in python_blocks() if "create_app(folder)" in b]
    placeholder = "path/to/resources_servers/example_session_state_mgmt"
    assert placeholder in block
    script = tmp_path / "readme_example.py"
    script.write_text(block.replace(placeholder, str(gym_root / "example_session_state_mgmt")))
    result = run_to_completion([sys.executable, str(script)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "1.0"
