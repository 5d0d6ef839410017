#!/usr/bin/env python3
"""Every repository path the docs and the README name in backticks exists, so they cannot rot."""

import re
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[2]
prefixes = ("src/", "include/", "tests/", "bench/", "scripts/", "experiments/", "evidence/", "python/", "tools/",
            "docs/", "cmake/", ".ci/", "examples/")
missing = []
files = [root / "README.md", *sorted((root / "docs" / "source").rglob("*.md")), root / "bench" / "SCHEMA.md",
         *sorted((root / "experiments").rglob("*.md"))]
checked = 0
for doc in files:
    for m in re.finditer(r"`([^`\s]+)`", doc.read_text()):
        path = m.group(1).rstrip(".,:;")
        if not path.startswith(prefixes) or any(c in path for c in "*<>{}$"):
            continue
        checked += 1
        if not (root / path).exists():
            missing.append(f"{doc.relative_to(root)}: `{path}` does not exist")
print(f"docs paths: {checked} checked in {len(files)} files, {len(missing)} missing")
for line in missing:
    print("  " + line)
sys.exit(1 if missing else 0)
