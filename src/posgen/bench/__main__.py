import importlib
import sys

from posgen.allocator import keep_freed_memory

NAMES = ["extract", "decompose", "synthetic", "scale", "init", "gpu", "ops"]

if len(sys.argv) < 2 or sys.argv[1] not in NAMES:
    sys.exit(f"usage: python -m posgen.bench {{{'|'.join(NAMES)}}} [options]")
# as the workflow's jobs do (workflow_scripts/_common.py): the second paper's keep large blocks too
keep_freed_memory(large_blocks=sys.argv[1] == "synthetic")
importlib.import_module(f"posgen.bench.{sys.argv[1]}").main(sys.argv[2:])
