"""The container image built from Debian packages (deploy/image/build.sh),
started for real.

* The image and deploy/Dockerfile describe the same image: user, working
  directory, ports, environment and entry point, parsed from the Dockerfile
  and read back with `podman image inspect` (and from build.sh's config).
* podman (runc, a private --root/--runroot, the rlimits spelled out) starts a
  container from it with the image's own defaults plus mounted token keys,
  as deploy/k8s/drey.yaml runs it; health is polled over gRPC with the
  image's own `drey` until SERVING; dreyd runs as uid 10001, writes to its
  data directory, and exits 0 on `podman stop`. Where podman cannot run,
  that test is skipped with podman's own words.
* Whatever podman can do here, the same root file system is also run
  another way: its own ld.so resolves every library of dreyd and drey
  inside the root file system, and runs dreyd and drey from it.

    DREYD=bazel-bin/dreyd DREY=bazel-bin/drey python3 tests/deploy/test_image.py
"""

import base64
import hashlib
import hmac
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(TOP, "deploy", "image", "build.sh")
DOCKERFILE = os.path.join(TOP, "deploy", "Dockerfile")
# What debian:12-slim, the Dockerfile's base, puts in the environment.
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
START_TIMEOUT = 30
PACE = 0.02


def run(argv, timeout=120, check=True, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError("%s exited %d:\n%s%s" % (shlex.join(argv), r.returncode, r.stdout, r.stderr))
    return r


def poll(probe, done, timeout, what):
    """Calls probe() until done(result) or the deadline; the pause only
    paces the polling."""
    end = time.monotonic() + timeout
    while True:
        last = probe()
        if done(last):
            return last
        if time.monotonic() > end:
            raise AssertionError("%s not reached within %ss; last: %r" % (what, timeout, last))
        time.sleep(PACE)


def read(path):
    with open(path) as f:
        return f.read()


def parse_dockerfile(path):
    """USER, WORKDIR, EXPOSE, ENV and ENTRYPOINT of the final stage, with
    continuation lines joined (a small parser for the instructions drey's
    Dockerfile uses; an instruction it does not know is an error)."""
    with open(path) as f:
        text = re.sub(r"\\\n", " ", f.read())
    cfg = {"User": None, "WorkingDir": None, "ExposedPorts": set(), "Env": dict(BASE_ENV), "Entrypoint": None}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "USER":
            cfg["User"] = rest.strip()
        elif word == "WORKDIR":
            cfg["WorkingDir"] = rest.strip()
        elif word == "EXPOSE":
            cfg["ExposedPorts"] |= {p if "/" in p else p + "/tcp" for p in rest.split()}
        elif word == "ENV":
            for pair in shlex.split(rest):
                k, eq, v = pair.partition("=")
                if not eq:
                    raise AssertionError("ENV without = is not handled: %r" % line)
                cfg["Env"][k] = v
        elif word == "ENTRYPOINT":
            cfg["Entrypoint"] = json.loads(rest)
        elif word not in ("FROM", "RUN", "COPY"):
            raise AssertionError("Dockerfile instruction %s is not compared: teach test_image.py" % word)
    return cfg


def normalize(config):
    """The same fields from an image's Config (podman image inspect)."""
    env = dict(e.split("=", 1) for e in config.get("Env") or [])
    return {"User": config.get("User"), "WorkingDir": config.get("WorkingDir"),
            "ExposedPorts": set(config.get("ExposedPorts") or {}), "Env": env,
            "Entrypoint": config.get("Entrypoint")}


def hs256(secret, claims):
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    signing_input = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode()) + "." + \
        b64(json.dumps(claims).encode())
    sig = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + b64(sig)


class Podman:
    """podman with a private store under `base`, removed by reset()."""

    def __init__(self, base):
        self.base = base
        self.argv = ["podman", "--root", os.path.join(base, "root"), "--runroot", os.path.join(base, "run"),
                     "--tmpdir", os.path.join(base, "tmp"), "--storage-driver", "vfs",
                     "--cgroup-manager", "cgroupfs", "--events-backend", "file"]

    def __call__(self, *args, timeout=120, check=True):
        return run(self.argv + list(args), timeout=timeout, check=check)

    def reset(self):
        """Removes the containers and images of this store, then the store.
        Not `podman system reset`: that also deletes the machine's podman
        networks, which are not this test's."""
        self("rm", "--all", "--force", check=False)
        self("rmi", "--all", "--force", check=False)
        base = os.path.realpath(self.base)
        with open("/proc/self/mountinfo") as f:
            mounts = [l.split()[4] for l in f]
        left = [m for m in mounts if m == base or m.startswith(base + "/")]
        for m in sorted(left, reverse=True):
            subprocess.run(["umount", "--lazy", m], capture_output=True)
        with open("/proc/self/mountinfo") as f:
            left = [l.split()[4] for l in f if l.split()[4].startswith(base + "/")]
        if left:
            # Never delete through a mount: that could reach host files.
            raise AssertionError("mounts left under %s, not removing it: %s" % (base, left))
        shutil.rmtree(self.base, ignore_errors=True)


def why_no_podman():
    """None when podman and runc are there to try, else why not."""
    for tool in ("podman", "runc"):
        if not shutil.which(tool) and not os.path.exists("/usr/sbin/" + tool):
            return "%s is not installed (bazel/drey.sh deps installs it)" % tool
    return None


class ImageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dreyd = os.path.abspath(os.environ["DREYD"])
        cls.drey = os.path.abspath(os.environ["DREY"])
        cls.tmp = tempfile.mkdtemp(prefix="drey-image-", dir=os.environ.get("TEST_TMPDIR"))
        cls.out = os.path.join(cls.tmp, "out")
        cls.no_podman = why_no_podman()
        cls.podman = None
        tag = "localhost/drey-test:%d" % os.getpid()
        env = dict(os.environ)
        argv = [BUILD]
        if cls.no_podman is None:
            # podman refuses a --runroot longer than 50 characters, which
            # Bazel's TEST_TMPDIR always is: a short private directory.
            cls.podman = Podman(tempfile.mkdtemp(prefix="drey-podman-", dir="/tmp"))
            env["PODMAN"] = shlex.join(cls.podman.argv)
            argv += ["--import", tag]
        t0 = time.monotonic()
        r = run(argv + [cls.out, cls.dreyd, cls.drey], timeout=600, env=env)
        cls.build_s = time.monotonic() - t0
        cls.tag = tag
        sys.stderr.write(r.stderr)
        size = os.path.getsize(os.path.join(cls.out, "rootfs.tar"))
        print("image: rootfs.tar %.1f MB, built%s in %.1f s" % (
            size / 1e6, " and imported" if cls.podman else "", cls.build_s), file=sys.stderr)

    @classmethod
    def tearDownClass(cls):
        if cls.podman:
            cls.podman.reset()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def config_lines(self):
        with open(os.path.join(self.out, "config")) as f:
            return [l.strip() for l in f if l.strip()]

    # --- the same image ----------------------------------------------------

    def test_build_config_matches_the_dockerfile(self):
        want = parse_dockerfile(DOCKERFILE)
        cfg = {"User": None, "WorkingDir": None, "ExposedPorts": set(), "Env": {}, "Entrypoint": None}
        for line in self.config_lines():
            word, _, rest = line.partition(" ")
            if word == "ENV":
                k, _, v = rest.partition("=")
                cfg["Env"][k] = v
            elif word == "EXPOSE":
                cfg["ExposedPorts"].add(rest + "/tcp")
            elif word == "USER":
                cfg["User"] = rest
            elif word == "WORKDIR":
                cfg["WorkingDir"] = rest
            elif word == "ENTRYPOINT":
                cfg["Entrypoint"] = json.loads(rest)
            else:
                self.fail("unexpected config line %r" % line)
        self.assertEqual(cfg, want)

    def test_the_dockerfile_installs_the_same_packages(self):
        """Both images hold the runtime libraries dreyd and drey link: what
        the Dockerfile names, the built image has, and what the build found
        with ldd, the Dockerfile's packages bring in (by name or as their
        dependencies: apt-cache depends --recurse)."""
        text = re.sub(r"\\\n", " ", read(DOCKERFILE))
        m = re.search(r"apt-get install -y --no-install-recommends ([^&]*)", text)
        self.assertIsNotNone(m, "no apt-get install in the Dockerfile")
        dockerfile = set(m.group(1).split())
        built = set(read(os.path.join(self.out, "packages")).split())
        sanitized = bool(built & {"libasan8", "libubsan1"})
        # --config=asan builds dreyd with the system malloc (.bazelrc), so
        # its image has no jemalloc; everything else is the same.
        missing = dockerfile - built - ({"libjemalloc2"} if sanitized else set())
        self.assertEqual(missing, set(), "installed by the Dockerfile, missing from the built image")
        closure = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                       "--no-breaks", "--no-replaces", "--no-enhances"] + sorted(dockerfile)).stdout
        closure = {l.strip() for l in closure.splitlines() if l and not l.startswith(" ")}
        if sanitized:
            closure |= {"libasan8", "libubsan1"}  # a sanitizer build links its runtimes
        self.assertEqual(built - closure, set(), "linked by dreyd or drey, not installed by the Dockerfile")

    def test_podman_image_matches_the_dockerfile(self):
        if self.podman is None:
            self.skipTest("podman cannot be used here: " + self.no_podman)
        inspect = json.loads(self.podman("image", "inspect", self.tag).stdout)
        self.assertEqual(len(inspect), 1)
        self.assertEqual(normalize(inspect[0]["Config"]), parse_dockerfile(DOCKERFILE))
        print("image: %s is %.1f MB in podman's store" % (self.tag, inspect[0]["Size"] / 1e6), file=sys.stderr)

    def test_root_filesystem_contents(self):
        with tarfile.open(os.path.join(self.out, "rootfs.tar")) as tar:
            members = {m.name.lstrip("./").rstrip("/"): m for m in tar.getmembers()}
            passwd = tar.extractfile(members["etc/passwd"]).read().decode()
        self.assertIn("drey:x:10001:10001:drey:/var/lib/drey:/usr/sbin/nologin", passwd.splitlines())
        for d in ("var/lib/drey", "var/lib/drey/data"):
            self.assertTrue(members[d].isdir(), d)
            self.assertEqual((members[d].uid, members[d].gid), (10001, 10001), d)
        for b in ("usr/local/bin/dreyd", "usr/local/bin/drey"):
            self.assertTrue(members[b].isfile() and members[b].mode & 0o111, b)
        self.assertFalse([n for n in members if n.startswith("etc/apt/sources.list")],
                         "the build machine's apt sources are left in the image")
        self.assertNotIn("bin/sh", members, "the image has a shell: more than dreyd needs")
        self.assertNotIn("usr/bin/apt", members)

    # --- podman --------------------------------------------------------------

    def test_container_serves_health_as_uid_10001(self):
        if self.podman is None:
            self.skipTest("podman cannot be used here: " + self.no_podman)
        keys = os.path.join(self.tmp, "keys")
        os.makedirs(keys)
        secret = os.urandom(32)
        with open(os.path.join(keys, "k1.HS256.key"), "wb") as f:
            f.write(secret)
        os.chmod(keys, 0o755)
        os.chmod(os.path.join(keys, "k1.HS256.key"), 0o644)
        name = "drey-test-%d" % os.getpid()
        hard = subprocess.run(["sh", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout.strip()
        if not hard.isdigit():
            hard = "1048576"  # "unlimited" is not a value --ulimit takes
        # The image's own defaults (0.0.0.0:50051, ops on 9090) in a network
        # namespace of the container's own, so parallel tests never collide;
        # token keys mounted as deploy/k8s/drey.yaml does (dreyd refuses a
        # non-loopback listener without them).
        started = time.monotonic()
        r = self.podman("run", "-d", "--name", name, "--runtime", "runc", "--network", "none",
                        # This sandbox caps open files and lacks
                        # CAP_SYS_RESOURCE: without both limits spelled
                        # out runc fails with "error setting rlimit".
                        "--ulimit", "nofile=%s:%s" % (hard, hard), "--ulimit", "nproc=32768:32768",
                        "-v", keys + ":/etc/drey/jwt:ro", "-e", "DREY_JWT_KEYS_DIR=/etc/drey/jwt",
                        "-e", "DREY_DRAIN_GRACE=0s", self.tag, check=False)
        if r.returncode != 0:
            self.skipTest("podman cannot start a container on this machine: " + r.stderr.strip().splitlines()[-1]
                          if r.stderr.strip() else "podman run exited %d" % r.returncode)
        self.addCleanup(lambda: self.podman("rm", "--force", name, check=False))

        def state():
            s = json.loads(self.podman("inspect", name).stdout)[0]["State"]
            return s

        def health():
            st = state()
            if not st["Running"]:
                self.fail("the container stopped (exit %s):\n%s" % (st["ExitCode"], self.podman("logs", name).stderr))
            return self.podman("exec", name, "/usr/local/bin/drey", "health", check=False).stdout.strip()

        poll(health, lambda s: s == "SERVING", START_TIMEOUT, "SERVING from inside the container")
        print("image: container SERVING %.2f s after podman run" % (time.monotonic() - started), file=sys.stderr)
        pid = state()["Pid"]
        with open("/proc/%d/status" % pid) as f:
            uids = [l.split()[1:] for l in f if l.startswith("Uid:")][0]
        self.assertEqual(uids, ["10001"] * 4, "dreyd does not run as uid 10001")
        self.assertEqual(self.podman("exec", name, "/usr/local/bin/drey", "health", "drey.cache.v1.Cache").stdout.strip(),
                         "SERVING")
        # A durable write lands in the data directory the image gives uid 10001.
        now = int(time.time())
        token = hs256(secret, {"sub": "image-test", "iat": now, "exp": now + 600})
        self.podman("exec", name, "/usr/local/bin/drey", "--token=" + token, "set", "k", "from the image")
        self.assertEqual(self.podman("exec", name, "/usr/local/bin/drey", "--token=" + token, "get", "k").stdout.strip(),
                         "from the image")
        r = self.podman("exec", name, "/usr/local/bin/drey", "get", "k", check=False)
        self.assertEqual(r.returncode, 1, "a call without a token must be refused")
        self.assertIn("TOKEN_MISSING", r.stderr)
        logs = self.podman("logs", name)
        lines = [json.loads(l) for l in (logs.stdout + logs.stderr).splitlines() if l.startswith("{")]
        listening = [l for l in lines if l.get("msg") == "listening"]
        self.assertEqual((listening[0]["listen"], listening[0]["ops_port"], listening[0]["jwt"]),
                         ("0.0.0.0:50051", 9090, True))
        self.assertTrue(any(l.get("msg") == "recovery: starting" and l.get("dir") == "/var/lib/drey/data"
                            for l in lines), lines)
        self.podman("stop", "--time", "30", name, timeout=60)
        self.assertEqual(state()["ExitCode"], 0, self.podman("logs", name).stderr)

    # --- the same root file system without podman -------------------------

    def test_root_filesystem_runs_with_its_own_loader(self):
        root = os.path.join(self.tmp, "rootfs")
        os.makedirs(root)
        run(["tar", "-xf", os.path.join(self.out, "rootfs.tar"), "-C", root, "--no-same-owner",
             "--exclude=./dev/*"])
        # The file itself: root/lib64/ld-linux-x86-64.so.2 is an absolute
        # symbolic link, which outside a chroot names the host's loader.
        lds = [p for p in (os.path.join(root, d, "x86_64-linux-gnu", "ld-linux-x86-64.so.2") for d in ("lib", "usr/lib"))
               if os.path.isfile(p) and not os.path.islink(p)]
        self.assertTrue(lds, "no ld-linux-x86-64.so.2 in the root fs")
        ld = lds[0]
        libpath = ":".join(os.path.join(root, d) for d in ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"))
        loader = [ld, "--library-path", libpath]
        real_root = os.path.realpath(root)
        for b in ("dreyd", "drey"):
            exe = os.path.join(root, "usr", "local", "bin", b)
            listing = run(loader + ["--list", exe]).stdout
            outside = [l for l in listing.splitlines() if "=>" in l and
                       not os.path.realpath(l.split("=>")[1].split("(")[0].strip()).startswith(real_root + "/")]
            self.assertEqual(outside, [], "%s resolves libraries outside the image's root fs:\n%s" % (b, listing))
        data = os.path.join(self.tmp, "data")
        log_path = os.path.join(self.tmp, "dreyd.log")
        env = {"DREY_LISTEN": "127.0.0.1:0", "DREY_OPS_LISTEN": "127.0.0.1:0", "DREY_DATA_DIR": data,
               "DREY_DRAIN_GRACE": "0s"}
        with open(log_path, "w") as log:
            proc = subprocess.Popen(loader + [os.path.join(root, "usr/local/bin/dreyd")], env=env, stderr=log,
                                    stdout=subprocess.DEVNULL)
        try:
            def port():
                if proc.poll() is not None:
                    self.fail("dreyd exited %d:\n%s" % (proc.returncode, read(log_path)))
                for line in read(log_path).splitlines():
                    if '"msg":"listening"' in line:
                        return json.loads(line)["port"]
                return None
            p = poll(port, lambda p: p, START_TIMEOUT, "dreyd (run by the image's ld.so) listening")
            drey = loader + [os.path.join(root, "usr/local/bin/drey"), "--addr=127.0.0.1:%d" % p]
            poll(lambda: run(drey + ["health"], check=False).stdout.strip(), lambda s: s == "SERVING",
                 START_TIMEOUT, "SERVING")
            run(drey + ["set", "k", "v"])
            self.assertEqual(run(drey + ["get", "k"]).stdout.strip(), "v")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
        self.assertEqual(rc, 0, read(log_path))


if __name__ == "__main__":
    unittest.main(verbosity=2)
