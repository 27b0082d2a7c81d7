"""A backup's disk fills up for real while clients write (replication
factor 2 on three durable nodes; n3's data directory is a small tmpfs with
no journal quota, so its journal meets ENOSPC): n3 refuses the records it
cannot journal and its primaries take it out of their in-sync sets, never
waiting on it; writes go on with the other copies. n3 also leads some
partitions: a write its own journal cannot take, but whose record its
backups took, is applied on n3 too and answered UNAVAILABLE
JOURNAL_WRITE_FAILED, outcome unknown (a retry with its request_id finds
it), so no copy differs from another (refusing it left n3 without a write
its backups had: the replicas check caught that). Once space is freed n3 is given its copies back,
and after healing nothing acknowledged is lost and every backup hashes like
its primary.

The test re-executes itself under `unshare --mount --propagation private`
(drey_harness.enter_private_mount_namespace) so the tmpfs cannot leak;
where that or the mount is not permitted it is skipped with the reason."""
import os
import unittest

from drey_cluster import wait_until
from drey_harness import DreyTestCase, enter_private_mount_namespace, fill_filesystem, main, mount_thin_disk, \
    mount_tmpfs
from drey_replication import Scenario, details

SKIP_REASON = None


class BackupDiskFull(DreyTestCase):
    SERVER_FLAGS = None

    @classmethod
    def setUpClass(cls):
        if SKIP_REASON:
            raise unittest.SkipTest(SKIP_REASON)
        super().setUpClass()

    def test_a_backup_whose_disk_fills_is_dropped_not_waited_for(self):
        self.mnt = mount_tmpfs(self, 24 << 20, "drey-repl-diskfull-")
        data = os.path.join(self.mnt, "n3")

        def on_tmpfs(cl):
            os.mkdir(data)
            cl.data_dirs["n3"] = data

        with Scenario(self, extra_flags=("--segment-bytes=256KiB",), prepare=on_tmpfs,
                      node_flags={"n3": ("--journal-max-bytes=0", "--snapshot-every=0",
                                         "--snapshot-every-bytes=0")}) as s:
            s.progress()
            n1 = s.cl.nodes["n1"]
            backed = lambda: [p for p, (_, r) in s.table(n1).items() if "n3" in r]
            self.assertTrue(backed())
            filler = os.path.join(self.mnt, "filler")
            self.assertGreater(fill_filesystem(filler), 0)
            shrinks = lambda: sum(details(s.cl.nodes[i])["inSyncShrinks"] for i in ("n1", "n2"))
            before = shrinks()
            # n3's preallocated segment takes records a while; then its
            # journal cannot grow and it refuses them
            wait_until(lambda: shrinks() > before and not backed(), timeout=120,
                       what="n3 out of every in-sync set")
            print("n3 dropped from the in-sync sets once its disk was full (%d shrinks)" % (shrinks() - before))
            s.progress()  # writes go on without it
            os.unlink(filler)
            s.stop_and_check()

    def test_a_primary_whose_journal_fails_hands_its_partitions_to_its_backups(self):
        """n1's data directory is on a thin disk (mount_thin_disk): once its
        backing is gone, n1's next fdatasync fails and its journal fails for
        good (every later append is refused until a restart). n1 marks
        itself draining; the controller hands every partition it led to an
        in-sync backup (nothing to copy) and its backup roles go to the
        others. Writes go on; nothing acknowledged is lost."""
        disk, backing = mount_thin_disk(self, 16 << 20)
        data = os.path.join(disk, "n1")

        def on_thin_disk(cl):
            os.mkdir(data)
            cl.data_dirs["n1"] = data

        with Scenario(self, extra_flags=("--segment-bytes=256KiB", "--snapshot-every=0", "--snapshot-every-bytes=0"),
                      prepare=on_thin_disk) as s:
            s.progress()
            n1 = s.cl.nodes["n1"]
            n2 = s.cl.nodes["n2"]
            self.assertTrue(s.led_by("n1", n2), "n1 leads partitions before its disk fails")
            self.assertGreater(fill_filesystem(os.path.join(backing, "filler")), 0)
            wait_until(lambda: "journal failed" in n1.server.log_text(), timeout=60,
                       what="n1's journal to fail on its next write")
            roles = lambda: [p for p, (primary, replicas) in s.table(n2).items()
                             if primary == "n1" or "n1" in replicas]
            wait_until(lambda: not roles(), timeout=120, what="n1 without a role in any partition")
            self.assertTrue(details(n1)["draining"])
            self.assertIn("its partitions go to their in-sync backups", n1.server.log_text())
            s.progress()  # writes go on through every node, n1 included (it forwards)
            s.stop_and_check(keep_copies=("n1",))  # its journal failed: no Drop can be journaled


if __name__ == "__main__":
    SKIP_REASON = enter_private_mount_namespace(__file__)
    main()
