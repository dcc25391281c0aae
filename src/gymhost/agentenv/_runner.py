"""The template runner's old module path (``python -m gymhost.agentenv._runner``), for an instance process started
by a gymhost from before ``gymhost.environments``; it is ``gymhost.environments._agentenv._template``."""

import sys

from ..environments._agentenv._template import main

if __name__ == "__main__":
    main(sys.argv[1:])
