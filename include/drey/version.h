/*
 * version — what a binary was built from: the release in VERSION, the git
 * revision (bazel/status.sh; "unknown" outside a git checkout, with
 * "-dirty" when tracked files had changes) and the build type (Bazel's
 * compilation mode, the allocator, sanitizers). dreyd, drey and drey-bench
 * print it for --version; dreyd also logs it first, puts it in readiness
 * details and exposes drey_build_info.
 */
#ifndef DREY_VERSION_H
#define DREY_VERSION_H

#include <stdio.h>

const char *drey_version(void);          /* "0.1.0" */
const char *drey_version_revision(void); /* a commit id, or "unknown" */
const char *drey_version_build(void);    /* "fastbuild jemalloc", "fastbuild system-malloc asan" */

/* "<program> <version> (revision <rev>, build <build>)" and a newline. */
void drey_version_print(FILE *out, const char *program);

#endif
