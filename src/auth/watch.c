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
#include <sys/stat.h>
#include <time.h>

#include "auth_internal.h"
#include "drey/clock.h"
#include "drey/log.h"

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static uint64_t mix(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= FNV_PRIME;
    }
    return h;
}

static uint64_t mix_stat(uint64_t h, const char *path) {
    struct stat st;
    int64_t f[9] = {0};
    if (stat(path, &st) != 0) {
        f[0] = -1;
        f[1] = errno;
    } else {
        f[0] = (int64_t)st.st_dev;
        f[1] = (int64_t)st.st_ino;
        f[2] = (int64_t)st.st_size;
        f[3] = (int64_t)st.st_mtim.tv_sec;
        f[4] = (int64_t)st.st_mtim.tv_nsec;
        f[5] = (int64_t)st.st_ctim.tv_sec;
        f[6] = (int64_t)st.st_ctim.tv_nsec;
        f[7] = (int64_t)st.st_mode;
        f[8] = (int64_t)st.st_nlink;
    }
    return mix(h, f, sizeof f);
}

uint64_t drey_auth__sources_fingerprint(const char *jwks_file, const char *keys_dir) {
    uint64_t h = FNV_OFFSET;
    if (jwks_file != NULL)
        h = mix_stat(mix(h, "j", 1), jwks_file);
    if (keys_dir != NULL) {
        h = mix_stat(mix(h, "d", 1), keys_dir);
        DIR *d = opendir(keys_dir);
        uint64_t sum = 0, count = 0;
        if (d != NULL) {
            struct dirent *de;
            char path[4096];
            while ((de = readdir(d)) != NULL) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                    continue;
                /* Entries come in no particular order: add up their hashes. */
                uint64_t eh = mix(FNV_OFFSET, de->d_name, strlen(de->d_name) + 1);
                if ((size_t)snprintf(path, sizeof path, "%s/%s", keys_dir, de->d_name) < sizeof path)
                    eh = mix_stat(eh, path);
                sum += eh;
                count++;
            }
            closedir(d);
        }
        h = mix(h, &sum, sizeof sum);
        h = mix(h, &count, sizeof count);
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
