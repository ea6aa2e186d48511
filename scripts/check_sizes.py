#!/usr/bin/env python3
"""Checks that no source file under src/ is over 600 lines and no function over 100 (CTest runs it
as `sizes`; docs/architecture.md). A function is found as a definition whose opening brace ends a
line outside any other function, and measured to its matching closing brace. A data table (a
function that only lists entries, like the config's field table) is marked by a comment line
`// (a data table)` right above it and is left out.
"""
import pathlib
import re
import sys

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 100
NOT_FUNCTIONS = re.compile(r"^\s*(if|for|while|switch|else|do|try|catch|namespace|class|struct|union|enum|return)\b|=\s*\{$|^\s*(\}|//|#)")


def code_of(line):
    """The line without its comment and with its strings and characters blanked (for brace counting)."""
    out, quote, i = [], None, 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
            i += 1
            continue
        if c in "\"'":
            quote = c
        elif line.startswith("//", i):
            break
        else:
            out.append(c)
        i += 1
    return "".join(out)


def functions(lines):
    """(first line, last line, name) of each function definition, 1-based."""
    found, i = [], 0
    while i < len(lines):
        code = code_of(lines[i]).rstrip()
        opens_function = code.endswith("{") and "(" in code and not NOT_FUNCTIONS.search(code)
        if not opens_function or "[" in code.split("(")[0]:  # a lambda is part of its function
            i += 1
            continue
        marked = i > 0 and lines[i - 1].strip() == "// (a data table)"
        depth, j = 0, i
        while j < len(lines):
            line = code_of(lines[j])
            depth += line.count("{") - line.count("}")
            if depth <= 0:
                break
            j += 1
        if not marked:
            found.append((i + 1, j + 1, code.split("(")[0].split()[-1] if code.split("(")[0].split() else "?"))
        i = j + 1
    return found


def main(root):
    problems = 0
    files = sorted(p for p in pathlib.Path(root, "src").rglob("*") if p.suffix in (".cpp", ".h"))
    for path in files:
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        if len(lines) > MAX_FILE_LINES + 1:
            print(f"sizes: {path.relative_to(root)} has {len(lines) - 1} lines (at most {MAX_FILE_LINES})", file=sys.stderr)
            problems += 1
        for first, last, name in functions(lines):
            if last - first + 1 > MAX_FUNCTION_LINES:
                print(f"sizes: {path.relative_to(root)}:{first}: {name} has {last - first + 1} lines (at most "
                      f"{MAX_FUNCTION_LINES})", file=sys.stderr)
                problems += 1
    if len(files) < 50:
        print(f"sizes: only {len(files)} source files found under {root}/src", file=sys.stderr)
        return 1
    if problems:
        print(f"sizes: {problems} file(s) or function(s) too long", file=sys.stderr)
        return 1
    print(f"sizes: {len(files)} files, none over {MAX_FILE_LINES} lines, no function over {MAX_FUNCTION_LINES}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent))
