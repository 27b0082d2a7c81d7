"""Build conventions of drey.

A module is include/drey/<name>.h (its whole public surface) plus
src/<name>/*.c and private headers; its unit tests are
tests/unit/<name>/*_test.c. These macros keep that mapping in one place.
"""

def drey_module(name, deps = []):
    # The public header is included as "drey/<name>.h". Private headers are
    # exported too, as "src/<name>/x.h", so the module's unit tests can reach
    # its internals; the module's own sources include them as "x.h".
    native.cc_library(
        name = name + "_api",
        hdrs = ["include/drey/%s.h" % name],
        strip_include_prefix = "include",
        deps = deps,
    )
    native.cc_library(
        name = name,
        srcs = native.glob(["src/%s/*.c" % name, "src/%s/*.cc" % name]),
        hdrs = native.glob(["src/%s/*.h" % name]),
        deps = [":%s_api" % name] + deps,
        visibility = ["//visibility:public"],
    )

def drey_unit_tests(module, deps = [], data = [], size = "small"):
    """One cc_test per tests/unit/<module>/*_test.c, linked with Criterion."""
    for src in native.glob(["%s/*_test.c" % module]):
        native.cc_test(
            name = src[:-len(".c")].replace("/", "_"),
            # A module's tests may have C++ helpers (abseil has no C API).
            srcs = [src] + native.glob(["%s/*.h" % module, "%s/*.cc" % module, "*.h"]),
            deps = deps + ["@system_libs//:criterion"],
            data = data,
            size = size,
        )

def drey_py_test(name, src, data = [], size = "medium", tags = [], dreyd = "//:dreyd"):
    """A Python integration test: Debian's /usr/bin/python3 runs `src`
    against the real dreyd binary (DREY_BIN) with stubs generated from
    proto/ at run time (see tests/integration/python/drey_harness.py)."""
    native.sh_test(
        name = name,
        srcs = ["//tests/integration/python:run.sh"],
        args = ["$(rootpath %s)" % dreyd, "$(rootpath %s)" % src],
        data = [
            src,
            dreyd,
            "//:protos",
            "//tests/integration/python:harness",
        ] + data,
        size = size,
        tags = tags,
    )

def drey_node_test(name, src, data = [], size = "medium"):
    """A Node.js interop test (@grpc/grpc-js) against the real dreyd.

    node_modules is installed by `npm ci` in tests/interop/node (the README's
    test command does it) and kept out of Bazel by .bazelignore; the runner
    executes the test from its real path so Node finds node_modules there."""
    native.sh_test(
        name = name,
        srcs = ["//tests/interop/node:run.sh"],
        args = ["$(rootpath //:dreyd)", "$(rootpath %s)" % src],
        data = [
            src,
            "//:dreyd",
            "//:protos",
            "//tests/interop/node:support",
        ] + data,
        size = size,
    )
