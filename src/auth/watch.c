/*
 * watch — reloads the keys when a key source changes on disk.
 *
 * Polling, not inotify: it sees through the symlink swaps Kubernetes uses
 * for mounted secrets and config maps, and costs a few stat(2) calls per
 * interval. Every interval the thread fingerprints the sources (metadata of
 * the JWKS file, the keys directory and each entry in it) and reloads when
 * the fingerprint differs from the one the last load attempt saw, whether
 * that attempt worked or not: a broken file is reported once, not every
 * interval, and the next change is tried again.
 */
#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "auth_internal.h"
#include "drey/io.h"
#include "drey/log.h"


uint64_t drey_auth__sources_fingerprint(const char *jwks_file, const char *keys_dir) {
    uint64_t h = DREY_IO_FNV_OFFSET;
    if (jwks_file != NULL)
        h = drey_io_fingerprint(drey_io_fnv(h, "j", 1), jwks_file);
    if (keys_dir != NULL) {
        h = drey_io_fingerprint(drey_io_fnv(h, "d", 1), keys_dir);
        DIR *d = opendir(keys_dir);
        uint64_t sum = 0, count = 0;
        if (d != NULL) {
            struct dirent *de;
            char path[4096];
            while ((de = readdir(d)) != NULL) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                    continue;
                /* Entries come in no particular order: add up their hashes. */
                uint64_t eh = drey_io_fnv(DREY_IO_FNV_OFFSET, de->d_name, strlen(de->d_name) + 1);
                if ((size_t)snprintf(path, sizeof path, "%s/%s", keys_dir, de->d_name) < sizeof path)
                    eh = drey_io_fingerprint(eh, path);
                sum += eh;
                count++;
            }
            closedir(d);
        }
        h = drey_io_fnv(h, &sum, sizeof sum);
        h = drey_io_fnv(h, &count, sizeof count);
    }
    return h;
}

/* One look: reload when the sources differ from what the last attempt saw. */
static void look(void *arg) {
    drey_auth *a = arg;
    uint64_t fp = drey_auth__sources_fingerprint(a->jwks_file, a->keys_dir);
    if (fp != atomic_load(&a->seen_sources))
        drey_auth__reload(a, "watch", NULL, 0); /* logs its outcome */
}

void drey_auth__watch_init(drey_auth *a) {
    drey_io_poller_init(&a->watcher, "auth keys", look, a);
}

void drey_auth_watch(drey_auth *a, int64_t interval_ms) {
    drey_io_poller_start(&a->watcher, interval_ms);
}

void drey_auth_stop_watch(drey_auth *a) {
    drey_io_poller_stop(&a->watcher);
}
