"""agent-env's own OpenEnv server for a bundle, started as agent-env's users start it (run in agent-env's venv):

    python tests/agent_env_server.py BUNDLE PORT

``agent_env.openenv.build_app(bundle)`` under uvicorn on 127.0.0.1, from the bundle's folder (agent-env reads the
bundle's ``.agentenv/config.toml`` from the working directory, and its env types are modules beside its tasks)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import uvicorn
from agent_env.openenv import build_app

if __name__ == "__main__":
    bundle = Path(sys.argv[1]).resolve()
    os.chdir(bundle)
    sys.path.insert(0, str(bundle))
    uvicorn.run(build_app(bundle), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
