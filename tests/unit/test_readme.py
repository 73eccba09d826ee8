"""README's map of src/posgen (Layout) names every module of the library."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "posgen"


def test_module_map_names_every_module():
    readme = (PACKAGE.parents[1] / "README.md").read_text()
    named = set(re.findall(r"^\| `([^`]+)` \|", readme.split("### `src/posgen`, module by module", 1)[1], flags=re.M))
    whole = {name.rstrip("/") for name in named if name.endswith("/")}  # a folder named in one row
    modules = [path.relative_to(PACKAGE) for path in sorted(PACKAGE.rglob("*.py"))]
    missing = [
        str(module)
        for module in modules
        if str(module) not in named
        and module.parts[0] not in whole
        and not (module.name == "__init__.py" and len(module.parts) > 1)  # a subpackage's face is optional
    ]
    assert not missing, f"README's module map lacks {', '.join(missing)}"
