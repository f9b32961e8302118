"""``python -m lowtide.bench.sim [--quick]``: the same as ``lowtide bench sim``."""

import argparse
import sys

from lowtide.bench.sim import add_arguments, main

parser = argparse.ArgumentParser(prog="python -m lowtide.bench.sim")
add_arguments(parser)
sys.exit(main(parser.parse_args()))
