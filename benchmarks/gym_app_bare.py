"""A Gym server's own floor: the FastAPI app ``create_app`` builds for a folder, with every middleware layer taken
out (gymhost's and Gym's alike), on uvicorn. What is left is Gym's app itself (its routes, its exception handlers,
its request and response models); the distance from here to ``gymhost serve`` is what gymhost's request path
costs, and the distance to ``fastapi_app.py`` is Gym's own. No session cookie is read or set.
`python benchmarks/gym_app_bare.py FOLDER PORT`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import uvicorn

from gymhost import create_app

if __name__ == "__main__":
    folder = Path(sys.argv[1]).resolve()
    app = create_app(folder)
    app.user_middleware.clear()  # before the first request builds the stack
    os.chdir(folder)  # as `gymhost serve` runs a server: in its folder
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
