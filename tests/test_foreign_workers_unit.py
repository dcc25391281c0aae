"""How many workers another ASGI server runs, read as that server reads it: several refuse, one serves."""

from __future__ import annotations

from pathlib import Path

import pytest

from gymhost._serving._foreign_workers import foreign_workers

pytestmark = pytest.mark.unit

UVICORN, HYPERCORN, GUNICORN = (
    "/venv/bin/uvicorn",
    "/venv/lib/python3.12/site-packages/hypercorn/__main__.py",
    "gunicorn",
)


@pytest.mark.parametrize(
    ("argv", "environ", "workers"),
    [
        ([UVICORN, "asgi:app", "--workers", "2"], {}, 2),
        ([UVICORN, "asgi:app", "--workers=3"], {}, 3),
        ([UVICORN, "asgi:app"], {"WEB_CONCURRENCY": "4"}, 4),
        ([UVICORN, "asgi:app"], {"UVICORN_WORKERS": "2"}, 2),  # uvicorn reads UVICORN_<OPTION>
        ([UVICORN, "asgi:app"], {"UVICORN_WORKERS": "3", "WEB_CONCURRENCY": "2"}, 3),  # before WEB_CONCURRENCY
        ([HYPERCORN, "asgi:app", "-w", "2"], {}, 2),
        ([HYPERCORN, "asgi:app", "-w2"], {}, 2),
        ([GUNICORN, "-k", "uvicorn.workers.UvicornWorker", "--workers", "5", "asgi:app"], {}, 5),
        ([GUNICORN, "asgi:app"], {"GUNICORN_CMD_ARGS": "-w 2"}, 2),
        ([GUNICORN, "asgi:app"], {"WEB_CONCURRENCY": "2"}, 2),
    ],
)
def test_several_workers_are_refused_naming_gymhost_serve_workers(
    argv: list[str], environ: dict[str, str], workers: int
) -> None:
    reason = foreign_workers(argv, environ)
    assert reason is not None
    assert f"runs {workers} workers" in reason
    assert f"gymhost serve --workers {workers}" in reason


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        ([UVICORN, "asgi:app"], {}),
        ([UVICORN, "asgi:app", "--workers", "1"], {"WEB_CONCURRENCY": "4"}),  # the flag wins, as in uvicorn
        ([HYPERCORN, "asgi:app"], {"WEB_CONCURRENCY": "4"}),  # hypercorn does not read it
        ([UVICORN, "asgi:app", "--reload", "--workers", "2"], {}),  # uvicorn reloads one process
        ([UVICORN, "asgi:app"], {"UVICORN_WORKERS": "2", "UVICORN_RELOAD": "y"}),
        ([UVICORN, "asgi:app"], {"UVICORN_WORKERS": ""}),  # empty is unset, as click reads it
        ([GUNICORN, "-w", "1", "asgi:app"], {}),
        (["/usr/bin/python3", "-c", "import asgi"], {"WEB_CONCURRENCY": "4"}),  # no server of workers
        (["gymhost", "serve", ".", "--workers", "2"], {}),  # gymhost's own workers route by owner
    ],
)
def test_one_worker_or_another_program_serves(argv: list[str], environ: dict[str, str]) -> None:
    assert foreign_workers(argv, environ) is None


def test_a_config_file_that_may_set_workers_is_refused_unless_its_count_can_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    unknown = foreign_workers([GUNICORN, "-c", "conf.py", "asgi:app"], {})
    assert unknown is not None
    assert "config file (conf.py)" in unknown
    assert "give gunicorn --workers 1" in unknown
    assert foreign_workers([GUNICORN, "-c", "conf.py", "-w", "1", "asgi:app"], {}) is None
    (tmp_path / "gunicorn.conf.py").write_text("workers = 2\n")  # read by gunicorn from the working directory
    assert foreign_workers([GUNICORN, "asgi:app"], {}) is not None
    (tmp_path / "one.toml").write_text("bind = '127.0.0.1:8000'\n")
    (tmp_path / "two.toml").write_text("workers = 2\n")
    assert foreign_workers([HYPERCORN, "-c", "one.toml", "asgi:app"], {}) is None
    assert "runs 2 workers" in (foreign_workers([HYPERCORN, "--config", "two.toml", "asgi:app"], {}) or "")
    assert foreign_workers([HYPERCORN, "-c", "python:settings", "asgi:app"], {}) is not None


def test_a_worker_count_that_is_not_a_number_is_said() -> None:
    assert foreign_workers([UVICORN, "asgi:app"], {"WEB_CONCURRENCY": "many"}) == (
        "uvicorn's worker count 'many' is not a number"
    )
