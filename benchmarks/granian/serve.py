"""`python serve.py FOLDER PORT {uvicorn,granian}`: what `gymhost serve FOLDER --port PORT` does, on either server.

`python serve.py bare PORT granian`: benchmarks/bare_app.py's app on the same granian runner (no LifespanRunner
difference: bare_app is Starlette, LifespanRunner passes it through the same way).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from granian_serving import run_app_granian

from gymhost._config import NO_TOKEN, ServeConfig
from gymhost._hosting._loading import load_app
from gymhost._serving._run import bind_socket, run_app

folder, port, server = sys.argv[1], int(sys.argv[2]), sys.argv[3]
log_level = sys.argv[4] if len(sys.argv) > 4 else "warning"
config = ServeConfig(port=port, server="uvicorn", log_level=log_level)
sock = bind_socket(config.host, config.port)
try:
    if folder == "bare":
        from bare_app import app
    else:
        app = load_app(folder, token=NO_TOKEN, address=sock.getsockname()[:2])
    print(f"serving at {sock.getsockname()}", flush=True)
    (run_app if server == "uvicorn" else run_app_granian)(app, sock, config)
finally:
    sock.close()
