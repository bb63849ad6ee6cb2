#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The dependency rule between ckpt's modules, checked over the include lines.

The rule is the Modules table of docs/architecture.md: one row per module of lib/ckpt, its
job, and the modules its files may include. This script reads that table (so the document
is the rule) and every `#include "ckpt/..."` line of lib/ckpt, lib/python, apps, bench and
examples, and reports each include that crosses an edge the table does not allow:

  - a file of module M includes a module not in M's row (its own module, and for a sub-module
    such as store/nodes its parent, are always allowed; a sub-module also has its parent's
    row, and listing a module allows its sub-modules);
  - a file outside module M includes one of M's detail/ headers (a module's detail/ is its own;
    dist/mpi is part of dist and store/<kind> part of store for this);
  - a module the table does not name (a new folder needs a row).

Files outside lib/ckpt (the umbrella header lib/ckpt/ckpt.hpp, the Python module, the
programs, benchmarks and examples) may include any module, but no detail/ header. Tests are
not checked: tests/<module> tests its module's details.

  check_includes.py [--source DIR] [--pretend FILE=HEADER ...]

--pretend adds an include line to a file as if it were there (FILE relative to the source
tree, HEADER as written after #include "ckpt/), so a test can show that a forbidden edge
fails. Exit 0 when every include is allowed, 1 listing each one that is not, 2 on a usage
error or when the table cannot be read.
"""
import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"ckpt/([^"]+)"', re.M)
ROW = re.compile(r'^\|\s*`([a-z_/]+)`\s*\|(.*)\|\s*$')
SCANNED = ["lib/ckpt", "lib/python", "apps", "bench", "examples"]
SUFFIXES = (".hpp", ".cpp", ".h", ".cc", ".in")


def read_rule(doc):
    """{module: set of modules it may include} from the Modules table of `doc`."""
    rule = {}
    in_table = False
    with open(doc, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                in_table = line.strip() == "## Modules"
                continue
            if not in_table:
                continue
            m = ROW.match(line.rstrip("\n"))
            if not m:
                continue
            cells = [c.strip() for c in m.group(2).split("|")]
            if len(cells) < 2:
                raise SystemExit(f"{doc}: the Modules row of `{m.group(1)}` has no 'may include' column")
            allowed = set(re.findall(r"`([a-z_/]+)`", cells[1]))
            rule[m.group(1)] = allowed
    if not rule:
        raise SystemExit(f"{doc}: no Modules table (a section '## Modules' with rows | `module` | job | may include |)")
    return rule


def module_of(path, rule):
    """The module of `path` (relative to lib/ckpt): the longest row name that prefixes it."""
    parts = path.split("/")
    for n in range(len(parts) - 1, 0, -1):
        cand = "/".join(parts[:n])
        if cand in rule:
            return cand
    return None


def owner_of_detail(header, rule):
    """The module whose detail/ holds `header`, or None for a header outside any detail/."""
    parts = header.split("/")
    if "detail" not in parts[:-1]:
        return None
    return module_of("/".join(parts[: parts.index("detail")]) + "/x", rule)


def same_family(a, b):
    """True if a and b are one module for the detail rule (dist/mpi in dist, store/<kind> in store)."""
    return a == b or a.split("/")[0] == b.split("/")[0]


def allowances(mine, rule):
    """What `mine` may include: its row, and for a sub-module (store/nodes) its parent's row too,
    but for the parent's other sub-modules (an edge between siblings is in the sibling's own row)."""
    allowed = set(rule[mine])
    parts = mine.split("/")
    for n in range(1, len(parts)):
        parent = "/".join(parts[:n])
        allowed |= {a for a in rule.get(parent, set()) if not a.startswith(parent + "/")}
    return allowed


def allowed_edge(mine, theirs, rule):
    """May module `mine` include a header of module `theirs`? Its own module, its parent (a
    sub-module builds on it), a module its row (or its parent's) lists, or a sub-module of one."""
    if theirs == mine or mine.startswith(theirs + "/"):
        return True
    # Listing a module allows its sub-modules, except to a sub-module of that module itself
    # (store/local listing store does not reach store/nodes).
    return any(theirs == a or (theirs.startswith(a + "/") and not mine.startswith(a + "/")) for a in allowances(mine, rule))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--pretend", action="append", default=[], metavar="FILE=HEADER")
    args = ap.parse_args()
    src = os.path.abspath(args.source)
    rule = read_rule(os.path.join(src, "docs", "architecture.md"))

    pretend = {}
    for p in args.pretend:
        if "=" not in p:
            print(f"check_includes: --pretend {p!r}: expected FILE=HEADER", file=sys.stderr)
            return 2
        f, h = p.split("=", 1)
        if not os.path.isfile(os.path.join(src, f)):
            print(f"check_includes: --pretend {p!r}: no file {f} in {src}", file=sys.stderr)
            return 2
        pretend.setdefault(f, []).append(h)

    bad = []
    files = 0
    for top in SCANNED:
        for root, _, names in os.walk(os.path.join(src, top)):
            for name in sorted(names):
                if not name.endswith(SUFFIXES):
                    continue
                full = os.path.join(root, name)
                rel = os.path.relpath(full, src)
                with open(full, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                files += 1
                includes = INCLUDE.findall(text) + pretend.get(rel, [])
                in_lib = rel.startswith("lib/ckpt/") and rel.count("/") > 2
                mine = module_of(rel[len("lib/ckpt/"):], rule) if in_lib else None
                if in_lib and mine is None:
                    bad.append(f"{rel}: module {rel.split('/')[2]!r} has no row in docs/architecture.md's Modules table")
                    continue
                for inc in includes:
                    if inc in ("version.hpp", "ckpt.hpp"):
                        continue
                    theirs = module_of(inc, rule)
                    if theirs is None:
                        bad.append(f'{rel}: #include "ckpt/{inc}": not in any module of the Modules table')
                        continue
                    owner = owner_of_detail(inc, rule)
                    if owner is not None and (mine is None or not same_family(mine, owner)):
                        bad.append(f'{rel}: #include "ckpt/{inc}": a detail/ header of {owner}, included from '
                                   f'{mine or "outside lib/ckpt"} (a module\'s detail/ is its own)')
                        continue
                    if mine is None or allowed_edge(mine, theirs, rule):
                        continue
                    allowed = allowances(mine, rule)
                    bad.append(f'{rel}: #include "ckpt/{inc}": {mine} may include {", ".join(sorted(allowed)) or "no module"}; '
                               f"not {theirs} (docs/architecture.md, Modules)")
    for b in bad:
        print(b)
    if files == 0:
        print(f"check_includes: no source files under {src}", file=sys.stderr)
        return 2
    print(f"check_includes: {files} files, {len(rule)} modules, {len(bad)} forbidden include(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
