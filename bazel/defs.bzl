"""Build conventions of drey.

A module is include/drey/<name>.h (its whole public surface) plus
src/<name>/*.c and private headers; its unit tests are
tests/unit/<name>/*_test.c. These macros keep that mapping in one place.
"""

def drey_module(name, deps = [], hdrs = None):
    native.cc_library(
        name = name,
        srcs = native.glob(["src/%s/*.c" % name, "src/%s/*.h" % name]),
        hdrs = hdrs if hdrs != None else ["include/drey/%s.h" % name],
        strip_include_prefix = "include",
        deps = deps,
        visibility = ["//visibility:public"],
    )

def drey_unit_tests(module, deps = [], data = [], size = "small"):
    """One cc_test per tests/unit/<module>/*_test.c, linked with Criterion."""
    for src in native.glob(["%s/*_test.c" % module]):
        native.cc_test(
            name = src[:-len(".c")].replace("/", "_"),
            srcs = [src] + native.glob(["%s/*.h" % module, "*.h"]),
            deps = deps + ["@system_libs//:criterion"],
            data = data,
            size = size,
        )
