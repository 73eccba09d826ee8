import importlib
import sys

NAMES = ["extract", "decompose", "synthetic", "scale"]

if len(sys.argv) < 2 or sys.argv[1] not in NAMES:
    sys.exit(f"usage: python -m posgen.bench {{{'|'.join(NAMES)}}} [options]")
importlib.import_module(f"posgen.bench.{sys.argv[1]}").main(sys.argv[2:])
