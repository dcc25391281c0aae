"""NeMo Gym resources server for the agent environment 'gridsim'.

Written by `gymhost write`. Serve it with `gymhost serve .` from this folder,
or let Gym's launcher (`gym env start`) run this file.
"""

from pathlib import Path

from gymhost.environments import WrittenResourcesServer


class GridsimV1ResourcesServer(WrittenResourcesServer):
    folder = Path(__file__).resolve().parent


if __name__ == "__main__":
    GridsimV1ResourcesServer.run_webserver()
