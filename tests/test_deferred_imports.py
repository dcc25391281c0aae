"""Gym's training-time dependencies are imported at first use, and nothing a server or Gym computes changes; mcp only
where an environment is hosted in the server's process.

Each check runs in a fresh interpreter: what is imported is process-wide, and this process has nemo-gym already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .agentenv_helpers import GRIDSIM

pytestmark = [pytest.mark.nemo_gym]

SERVING = """
from gymhost._nemo_gym import require_nemo_gym
require_nemo_gym()
import nemo_gym.base_resources_server, nemo_gym.rollout_collection
"""


def run(code: str, *, deferred: bool = True) -> str:
    prelude = SERVING if deferred else "import nemo_gym.base_resources_server, nemo_gym.rollout_collection\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_serving_imports_none_of_gyms_reward_profiling_stack() -> None:
    """Nor rich, Pygments and markdown-it: Gym's launcher help (``config_types``) and httpx's command-line client."""
    unused = "{'pandas', 'scipy', 'ray', 'hydra', 'rich', 'pygments', 'markdown_it'}"
    imported = run(f"import sys; print(sorted({unused} & set(sys.modules)))")
    assert imported == "[]"


@pytest.mark.parametrize(("mode", "imported"), [("process", "[]"), ("in_process", "['jsonschema', 'mcp']")])
def test_a_server_imports_mcp_only_where_it_hosts_an_environment(mode: str, imported: str, tmp_path: Path) -> None:
    """A written folder's server, started (its lifespan run, its pool's first instances up): in process mode its
    instances are processes and it never imports mcp nor jsonschema; in-process, it does."""
    from gymhost.environments import write_folder

    folder = write_folder(str(GRIDSIM), tmp_path / "root", mode=mode).path
    found = run(
        f"""
        import sys
        from starlette.testclient import TestClient
        from gymhost import create_app
        with TestClient(create_app({str(folder)!r})) as client:
            assert client.get("/agentenv/pool").json()["free"] > 0
        print(sorted({{'mcp', 'jsonschema'}} & set(sys.modules)))
        """
    )
    assert found == imported


def test_what_is_deferred_still_works_when_used() -> None:
    """Gym's launcher help prints with rich through the stand-ins (its Markdown, its Text), and ``httpx.main`` (the
    ``httpx`` command's entry point) runs httpx's real command-line client."""
    shown = run(
        """
        import contextlib, io, sys
        from nemo_gym.config_types import BaseNeMoGymCLIConfig

        class Example(BaseNeMoGymCLIConfig):
            \"\"\"What the *example* does.\"\"\"

            rounds: int = 3

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            Example.model_validate({"help": True})
        import httpx
        sys.argv = ["httpx", "--help"]
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            httpx.main()
        print(repr(out.getvalue()))
        """
    )
    assert "Displaying help for Example" in shown, shown
    assert "What the example does." in shown, shown  # rendered from Markdown
    assert "- rounds (int)" in shown, shown
    assert "A next generation HTTP client" in shown, shown


def test_gyms_own_aggregate_metrics_are_the_same_and_then_use_the_real_pandas() -> None:
    aggregate = """
    import json
    from nemo_gym import reward_profile
    responses = [
        {"reward": reward, "_ng_task_index": task, "_ng_rollout_index": rollout, "num_tool_calls": task + rollout}
        for task in range(3) for rollout, reward in enumerate((1.0, 0.0, 1.0, float(task % 2)))
    ]
    metrics = reward_profile.compute_aggregate_metrics(responses).model_dump(mode="json")
    import pandas
    assert reward_profile.DataFrame is pandas.DataFrame, reward_profile.DataFrame
    print(json.dumps(metrics, sort_keys=True))
    """
    deferred = json.loads(run(aggregate))
    assert deferred["group_level_metrics"], deferred
    assert deferred == json.loads(run(aggregate, deferred=False))


def test_a_stand_in_is_the_object_to_isinstance_formatting_and_attributes() -> None:
    checked = run(
        """
        import nemo_gym.reward_profile as profile
        from gymhost._deferred_imports import _Deferred
        stand_in = profile.__dict__["Series"]
        assert isinstance(stand_in, _Deferred), "imported already"
        import pandas
        assert isinstance(pandas.Series([1]), stand_in)
        assert issubclass(pandas.Series, stand_in)
        assert profile.Series is pandas.Series
        import wandb
        assert f"{profile.Histogram}" == f"{wandb.Histogram}" and profile.Histogram.__name__ == "Histogram"
        print("ok")
        """
    )
    assert checked == "ok"


def test_gym_imports_where_ray_is_not_installed_and_reads_that_it_is_not() -> None:
    """The image installs nemo-gym without its training-time dependencies: 0.7.0's global_config asks Ray's version
    at import (for the launcher's pins), which would fail the import."""
    missing = """
import importlib.metadata
real = importlib.metadata.version
def version(name):
    if name == "ray":
        raise importlib.metadata.PackageNotFoundError(name)
    return real(name)
importlib.metadata.version = version
"""
    read = "import nemo_gym.global_config as c; print(getattr(c, 'ray_version', 'never read'))"
    done = subprocess.run([sys.executable, "-c", missing + SERVING + read], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    from importlib.metadata import version

    from packaging.version import Version

    reads_it = Version(version("nemo-gym")) >= Version("0.5")  # 0.4.0 imports Ray (deferred), reads ray.__version__
    assert done.stdout.strip().splitlines()[-1] == ("0+not.installed" if reads_it else version("ray"))
    undeferred = subprocess.run(
        [sys.executable, "-c", missing + "import nemo_gym.global_config"], capture_output=True, text=True, timeout=300
    )
    assert (undeferred.returncode != 0) == reads_it, undeferred.stderr  # what an install without Ray met before
