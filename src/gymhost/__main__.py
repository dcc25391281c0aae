"""``python -m gymhost``: the same command line as ``gymhost``."""

from gymhost.cli import main

if __name__ == "__main__":
    main(prog_name="gymhost")
