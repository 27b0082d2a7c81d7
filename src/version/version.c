/*
 * version — the build's identity; see include/drey/version.h. The strings
 * come from a header the build stamps (//:build_info_h), so a new revision
 * recompiles this file only.
 */
#include "drey/version.h"

#include <dlfcn.h>

#include "drey_build_info.h"

#if defined(__SANITIZE_ADDRESS__)
#define DREY_BUILD_SANITIZERS " asan"
#else
#define DREY_BUILD_SANITIZERS ""
#endif

const char *drey_version(void) {
    return DREY_BUILD_VERSION;
}

const char *drey_version_revision(void) {
    return DREY_BUILD_REVISION;
}

/* The allocator is looked up at run time, as src/memory does: one object
 * file serves the jemalloc and the system-malloc binaries. */
const char *drey_version_build(void) {
    if (dlsym(RTLD_DEFAULT, "mallctl") != NULL)
        return DREY_BUILD_MODE " jemalloc" DREY_BUILD_SANITIZERS;
    return DREY_BUILD_MODE " system-malloc" DREY_BUILD_SANITIZERS;
}

void drey_version_print(FILE *out, const char *program) {
    fprintf(out, "%s %s (revision %s, build %s)\n", program, drey_version(), drey_version_revision(),
            drey_version_build());
}
