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
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "auth_internal.h"
#include "drey/clock.h"
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

static void *watch_main(void *arg) {
    drey_auth *a = arg;
    pthread_mutex_lock(&a->watch_mu);
    while (!a->watch_stop) {
        int64_t until = drey_deadline_after_ms(a->watch_interval_ms);
        while (!a->watch_stop && drey_cond_wait_until(&a->watch_cv, &a->watch_mu, until) != ETIMEDOUT) {
        }
        if (a->watch_stop)
            break;
        pthread_mutex_unlock(&a->watch_mu);
        uint64_t fp = drey_auth__sources_fingerprint(a->jwks_file, a->keys_dir);
        if (fp != atomic_load(&a->seen_sources))
            drey_auth__reload(a, "watch", NULL, 0); /* logs its outcome */
        pthread_mutex_lock(&a->watch_mu);
    }
    pthread_mutex_unlock(&a->watch_mu);
    return NULL;
}

void drey_auth_watch(drey_auth *a, int64_t interval_ms) {
    pthread_mutex_lock(&a->watch_ctl);
    pthread_mutex_lock(&a->watch_mu);
    if (a->watching) {
        pthread_mutex_unlock(&a->watch_mu);
        pthread_mutex_unlock(&a->watch_ctl);
        return;
    }
    a->watch_interval_ms = interval_ms > 0 ? interval_ms : 1;
    a->watch_stop = false;
    int rc = pthread_create(&a->watch_thread, NULL, watch_main, a);
    a->watching = rc == 0;
    pthread_mutex_unlock(&a->watch_mu);
    pthread_mutex_unlock(&a->watch_ctl);
    if (rc != 0)
        DREY_LOG_ERROR("auth key watcher not started", DREY_LOG_STR("reason", strerror(rc)));
}

void drey_auth_stop_watch(drey_auth *a) {
    pthread_mutex_lock(&a->watch_ctl);
    pthread_mutex_lock(&a->watch_mu);
    if (!a->watching) {
        pthread_mutex_unlock(&a->watch_mu);
        pthread_mutex_unlock(&a->watch_ctl);
        return;
    }
    a->watch_stop = true;
    pthread_cond_signal(&a->watch_cv);
    pthread_t t = a->watch_thread;
    pthread_mutex_unlock(&a->watch_mu);
    pthread_join(t, NULL);
    pthread_mutex_lock(&a->watch_mu);
    a->watching = false;
    pthread_mutex_unlock(&a->watch_mu);
    pthread_mutex_unlock(&a->watch_ctl);
}
