#!/usr/bin/env python3
"""The layering of docs/architecture.md, checked over every #include "..." of src/ and include/.

Each folder of src/ is a layer (core < io < kernels < model < serve < cli; text sits beside the
model) and may include only the layers its row of the architecture table names; include/dsv4.h
is the model's public header; the model includes no backend's device code (kernels/cuda/)
nor the CPU backend's ops and helpers (kernels/cpu/cpu.h). The files of model/ include each other without a cycle.

usage: check_layers.py [ROOT]   (ROOT holds src/ and include/; default: the checkout)
Prints each violation and exits 1 when there is any, 0 otherwise."""
import os
import re
import sys

# What each layer may include: layers, or single headers (a path with a slash). Every layer
# uses core and its own folder.
USES = {
    "core": [],
    "io": [],
    "kernels": ["io"],
    "text": [],
    "model": ["io", "kernels", "dsv4.h", "text/token_map.h"],
    "serve": ["text", "dsv4.h"],
    "cli": ["io", "kernels", "text", "model", "serve", "dsv4.h"],
}
# What a layer never includes although its layer is allowed: the model is written against the
# op table and names no backend's device code, nor the CPU backend's ops and helpers.
NEVER = {"model": ["kernels/cuda/", "kernels/cpu/cpu.h"]}
PUBLIC = "dsv4.h"   # include/dsv4.h: the model's public API (model implements it)

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCE = (".c", ".h", ".cu", ".cuh")


def layer_of(rel):
    """The layer of a path relative to src/ or the public header."""
    return "model" if rel == PUBLIC else rel.split("/", 1)[0]


def allowed(frm, target):
    """Whether a file of layer frm may include target (a path relative to src/, or PUBLIC)."""
    to = layer_of(target)
    if any(target.startswith(p) for p in NEVER.get(frm, [])):
        return False
    if to in (frm, "core"):
        return True
    # an entry is a single header (a path, or PUBLIC) or a whole layer
    return any(u == target or ("/" not in u and u != PUBLIC and u == to and target != PUBLIC) for u in USES[frm])


def files(root):
    for top in ("src", "include"):
        base = os.path.join(root, top)
        for d, dirs, names in os.walk(base):
            dirs.sort()
            for n in sorted(names):
                if n.endswith(SOURCE):
                    p = os.path.join(d, n)
                    rel = os.path.relpath(p, base).replace(os.sep, "/")
                    yield p, (rel if top == "src" else ("dsv4.h" if rel == PUBLIC else "include/" + rel))


def resolve(root, name):
    """An include as the build finds it (-Iinclude -Isrc): its name relative to src/, PUBLIC, or None."""
    if name == PUBLIC and os.path.isfile(os.path.join(root, "include", name)):
        return PUBLIC
    if os.path.isfile(os.path.join(root, "src", name)):
        return name
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    bad = []
    graph = {}   # model/ file -> the model/ files it includes
    n_inc = 0
    for path, rel in files(root):
        frm = layer_of(rel)
        if frm not in USES:
            bad.append(f"{rel}: folder '{frm}' is not a layer of docs/architecture.md")
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for ln, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                n_inc += 1
                target = resolve(root, m.group(1))
                if target is None:
                    bad.append(f"{rel}:{ln}: #include \"{m.group(1)}\" is not a file of src/ or include/dsv4.h")
                    continue
                if not allowed(frm, target):
                    may = ", ".join(["core", frm] + USES[frm]) + "".join(f"; never {p}" for p in NEVER.get(frm, []))
                    bad.append(f"{rel}:{ln}: #include \"{m.group(1)}\" runs from {frm} to {layer_of(target)} "
                               f"({frm} may include: {may})")
                if frm == "model" and layer_of(target) == "model" and target != PUBLIC:
                    graph.setdefault(rel, set()).add(target)
    # cycles among model/ files: depth-first, a back edge closes one
    state, stack = {}, []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                cyc = stack[stack.index(v):] + [v]
                bad.append("include cycle in model/: " + " -> ".join(cyc))
            elif not state.get(v):
                visit(v)
        stack.pop()
        state[u] = 2

    for u in sorted(graph):
        if not state.get(u):
            visit(u)
    for b in bad:
        print(b)
    print(f"{n_inc} includes checked, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
