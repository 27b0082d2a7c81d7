"""Every link of the README and of docs/*.md reaches something.

For each page given (README.md first, then the pages of docs/), every inline
link and image outside code (`[text](target)`, `![alt](target)`) that is not
a URL must name a file or directory of the repository, relative to the page,
and, when it names a heading (`page.md#anchor`, `#anchor`), a heading of that
page under GitHub's anchor rule. The README must link every page of docs/.

The pages arrive as Bazel runfiles; the targets are looked up in the source
tree the runfiles point to (their real paths), which Bazel does not track:
the test is tagged external so that it always runs.
"""
import os
import re
import sys

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]*(?:\([^()\s]*\))?[^()\s]*)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def prose_lines(text):
    """(number, line) for each line outside fenced code, code spans blanked."""
    inside = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield n, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped
    (hyphens and underscores kept), each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link's text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen = {}
        found = set()
        inside = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if FENCE.match(line):
                    inside = not inside
                    continue
                m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
                if inside or not m:
                    continue
                a = slug(m.group(1))
                n = seen.get(a, 0)
                seen[a] = n + 1
                found.add(a if n == 0 else "%s-%d" % (a, n))
        cache[path] = found
    return cache[path]


def check(page):
    """The broken links of page (a real path), as messages; and the set of
    real paths it links to."""
    problems, targets = [], set()
    here = os.path.dirname(page)
    with open(page, encoding="utf-8") as f:
        text = f.read()
    for n, line in prose_lines(text):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(here, path)) if path else page
            where = "%s:%d: %s" % (page, n, target)
            if not os.path.exists(dest):
                problems.append("%s: no such file" % where)
                continue
            targets.add(dest)
            if anchor:
                if not dest.endswith(".md") or os.path.isdir(dest):
                    problems.append("%s: an anchor into a file that is not markdown" % where)
                elif anchor not in anchors(dest):
                    problems.append("%s: %s has no heading with the anchor #%s" % (where, os.path.relpath(dest, here), anchor))
    return problems, targets


def main(argv):
    pages = [os.path.realpath(p) for p in argv]
    readme = pages[0]
    if os.path.basename(readme) != "README.md" or not pages[1:]:
        print("usage: docs_links_test.py README.md docs/*.md", file=sys.stderr)
        return 2
    docs = os.path.join(os.path.dirname(readme), "docs")
    problems, count = [], 0
    linked_from_readme = set()
    for page in pages:
        p, targets = check(page)
        problems += p
        count += len(targets)
        if page == readme:
            linked_from_readme = targets
    on_disk = {os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md")}
    given = set(pages[1:])
    for missing in sorted(on_disk - given):
        problems.append("%s is not in //docs:docs (the test was not given it)" % missing)
    for page in sorted(given - linked_from_readme):
        problems.append("README.md does not link %s" % os.path.relpath(page, os.path.dirname(readme)))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    print("docs_links_test: %d pages, every link resolves (%d distinct targets)" % (len(pages), count))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
