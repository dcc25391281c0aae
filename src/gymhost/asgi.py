"""A module-level ``app`` for ASGI servers that import apps by name.

``GYMHOST_FOLDER=path/to/folder uvicorn gymhost.asgi:app`` (or ``hypercorn gymhost.asgi:app``); the folder may also
be a Gym root or the name of an installed Gym server, or several of these separated by spaces, as for ``gymhost
serve`` with no argument. The repository's
top-level ``asgi.py`` re-exports this, for ``uvicorn asgi:app`` from a checkout. The app is built by the same
code as ``gymhost serve``'s (``Server.load``): a folder's requirements checked, the open-files limit raised, this
replica's identity set, GYMHOST_TOKEN honoured; a Gym root (a folder holding ``resources_servers/<name>/``) gives a
gateway with every server at ``/<name>/``. Under that server's own workers it refuses to load
(``_serving._foreign_workers``).

A missing or wrong folder ends the process with one line on stderr (``SystemExit``): the ASGI server is
importing this module, and a traceback through its importer would bury the message.
"""

from __future__ import annotations

from ._config import (
    FOLDER_ENV_VAR,
    FOLDERS_SPLIT_NOTE,
    ServeConfig,
    configured_folders,
)
from ._exceptions import FolderError, GymhostError
from ._serving._foreign_workers import refuse_foreign_workers
from ._serving._run import held_collection
from ._serving._server import Server
from ._sessions._signing import describe_secret

__all__ = ["ENV_VAR", "app"]

ENV_VAR = FOLDER_ENV_VAR


def _app_from_environment() -> object:
    refuse_foreign_workers()  # `uvicorn asgi:app --workers N` would lose episodes: `gymhost serve --workers N`
    folders = configured_folders()
    if not folders:
        raise SystemExit(
            f"gymhost: {ENV_VAR} is not set; set it to a resources-server folder, "
            f"e.g. {ENV_VAR}=path/to/resources_servers/my_server uvicorn asgi:app"
        )
    try:  # a folder, a Gym root, or an installed Gym server's name; built as gymhost serve builds it
        server = Server(ServeConfig(paths=folders))
        app = server.load()
        server.say(describe_secret())  # where a restart finds it, and what replicas need
        return app
    except GymhostError as error:
        note = f" ({FOLDERS_SPLIT_NOTE})" if isinstance(error, FolderError) and len(folders) > 1 else ""
        raise SystemExit(f"gymhost: {ENV_VAR}={' '.join(folders)}: {error}{note}") from None


with held_collection():  # what the build makes frozen as it ends
    app = _app_from_environment()
