#!/usr/bin/env python3
"""The cluster's rooms call one way.

src/cluster is split into rooms, each behind its own header (see the top
of src/cluster/internal.h): the table, peers, the partition object, the
backup, the primary, the mover, the router, the controller and its pure
planners, the Watch subscriptions. This checks the layering the headers
promise, on the sources themselves:

- a room's header includes no other room's header but the shared model's
  (internal.h, partition.h, peers.h);
- the rooms' includes form no circle (room A includes B's header and B
  A's, directly or through others);
- no circle of calls between files either: a function a file defines and
  another calls is an edge, and no file reaches itself.

Each is shown failing in the same run on a small made-up tree.
"""
import os
import re
import sys

HEADER_OF = {  # a room's files and its header
    "table.h": ("table.c", "topology.c", "entry.c"),
    "peers.h": ("peers.c",),
    "partition.h": ("partition.c",),
    "backup.h": ("backup.c",),
    "primary.h": ("replicate.c",),
    "mover.h": ("move.c",),
    "router.h": ("router.c", "owner.c", "gather.c", "fanout.c"),
    "controller.h": ("controller.c",),
    "plan.h": ("plan.c",),
    "room.h": ("room.c",),
    "subscribe.h": ("subscribe.c",),
    "internal.h": ("cluster.c", "status.c", "tenants.c"),  # the lifecycle, the report, the tenants' hook: the top
}
SHARED = {"internal.h", "partition.h", "peers.h"}


def room_of(name):
    for h, files in HEADER_OF.items():
        if name == h or name in files:
            return h
    return None


def local_includes(text):
    return re.findall(r'#include "([\w.]+\.h)"', text)


def find_cycle(edges):
    """A cycle in the graph (node -> set of nodes) as a list, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if state.get(m) is None:
                found = visit(m)
                if found:
                    return found
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(edges):
        if state.get(n) is None:
            found = visit(n)
            if found:
                return found
    return None


def problems(files):
    """files: name -> text. The layering's violations."""
    out = []
    for name, text in sorted(files.items()):
        if name.endswith(".h") and name not in SHARED:
            for inc in local_includes(text):
                if inc not in SHARED:
                    out.append("%s includes %s: a room's header includes only the shared model" % (name, inc))
    rooms = {}
    for name, text in files.items():
        r = room_of(name)
        if r is None:
            out.append("%s belongs to no room (add it to HEADER_OF)" % name)
            continue
        for inc in local_includes(text):
            q = room_of(inc)
            if q is not None and q != r and inc not in ("internal.h",):
                rooms.setdefault(r, set()).add(q)
    cycle = find_cycle(rooms)
    if cycle:
        out.append("rooms include each other in a circle: " + " -> ".join(cycle))
    defs = {}
    for name, text in files.items():
        if name.endswith(".c"):
            for m in re.finditer(r"^(?!static)[\w\s\*]+?\b(drey_cluster\w*)\s*\([^;]*?\)\s*\{", text, re.M):
                defs[m.group(1)] = name
    calls = {}
    for name, text in files.items():
        if name.endswith(".c"):
            for fn, where in defs.items():
                if where != name and re.search(r"\b%s\b" % fn, text):
                    calls.setdefault(name, set()).add(where)
    cycle = find_cycle(calls)
    if cycle:
        out.append("files call each other in a circle: " + " -> ".join(cycle))
    return out


def selftest():
    """Each rule seen failing on a made-up tree."""
    good = {"table.c": '#include "table.h"\nvoid drey_cluster__a(void) {}\n',
            "table.h": '#include "internal.h"\n', "internal.h": "",
            "router.c": '#include "table.h"\nvoid drey_cluster__b(void) { drey_cluster__a(); }\n',
            "router.h": '#include "internal.h"\n'}
    assert problems(good) == [], problems(good)
    bad = dict(good, **{"table.h": '#include "router.h"\n'})
    assert any("includes router.h" in p for p in problems(bad)), problems(bad)
    bad = dict(good, **{"table.c": '#include "router.h"\nvoid drey_cluster__a(void) {}\n'})
    assert any("include each other" in p for p in problems(bad)), problems(bad)
    bad = dict(good, **{"table.c": '#include "table.h"\nvoid drey_cluster__a(void) { drey_cluster__b(); }\n'})
    assert any("call each other" in p for p in problems(bad)), problems(bad)
    bad = dict(good, **{"stray.c": ""})
    assert any("no room" in p for p in problems(bad)), problems(bad)


def main():
    selftest()
    root = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else __file__)))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "..", "..", "src", "cluster")
    files = {n: open(os.path.join(src, n)).read() for n in os.listdir(src) if n.endswith((".c", ".h"))}
    found = problems(files)
    for p in found:
        print(p)
    print("%d files, %d problems" % (len(files), len(found)))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
