#!/usr/bin/env python3
"""Checks that no source file under src/ is over 600 lines and no function over 100 (CTest runs it
as `sizes`; docs/architecture.md). Functions are found by a real parser, Universal Ctags (every
function and method definition, with the line its body ends on), not by a pattern. A data table
(a function that only lists entries, like the config's field table) is marked by a comment line
`// (a data table)` right above it and is left out.
"""
import json
import pathlib
import shutil
import subprocess
import sys

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 100
MIN_FUNCTIONS = 1000  # fewer found means the parser did not run as meant


def functions(root):
    """{path: [(first line, last line, name)]} of every function definition under root/src, 1-based."""
    if shutil.which("ctags") is None:
        sys.exit("sizes: needs Universal Ctags (apt-get install universal-ctags; scripts/setup.sh installs it)")
    out = subprocess.run(["ctags", "--output-format=json", "--fields=+ne", "--kinds-C++=f", "--languages=C++",
                          "--map-C++=+.h", "-R", "-f", "-", "src"], cwd=root, check=True, capture_output=True, text=True)
    found = {}
    for line in out.stdout.splitlines():
        tag = json.loads(line)
        if tag.get("_type") != "tag" or "end" not in tag:
            continue
        found.setdefault(pathlib.Path(root, tag["path"]), []).append((tag["line"], tag["end"], tag["name"]))
    return found


def main(root):
    problems = 0
    files = sorted(p for p in pathlib.Path(root, "src").rglob("*") if p.suffix in (".cpp", ".h"))
    defined = functions(root)
    count = sum(len(v) for v in defined.values())
    for path in files:
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        if len(lines) > MAX_FILE_LINES + 1:
            print(f"sizes: {path.relative_to(root)} has {len(lines) - 1} lines (at most {MAX_FILE_LINES})", file=sys.stderr)
            problems += 1
        for first, last, name in defined.get(path, []):
            if first >= 2 and lines[first - 2].strip() == "// (a data table)":
                continue
            if last - first + 1 > MAX_FUNCTION_LINES:
                print(f"sizes: {path.relative_to(root)}:{first}: {name} has {last - first + 1} lines (at most "
                      f"{MAX_FUNCTION_LINES})", file=sys.stderr)
                problems += 1
    if len(files) < 50:
        print(f"sizes: only {len(files)} source files found under {root}/src", file=sys.stderr)
        return 1
    if count < MIN_FUNCTIONS:
        print(f"sizes: ctags found only {count} functions under {root}/src", file=sys.stderr)
        return 1
    if problems:
        print(f"sizes: {problems} file(s) or function(s) too long", file=sys.stderr)
        return 1
    print(f"sizes: {len(files)} files, none over {MAX_FILE_LINES} lines; {count} functions, none over {MAX_FUNCTION_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent))
