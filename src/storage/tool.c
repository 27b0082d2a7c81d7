/*
 * `dreyd storage inspect|verify|dump|repair <dir>` — the offline tools.
 *
 * They read a data directory without a running node. inspect and verify
 * print the manifest, every snapshot and every segment with its LSN range and
 * problems (file and offset); verify exits 1 on damage. dump prints every
 * journal record and snapshot entry (keys JSON-escaped; values by kind and
 * size only). repair cuts the journal at its first problem, which only an
 * operator may decide, and says what it dropped.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drey/journal/v1/journal.pb-c.h"
#include "drey/log.h"
#include "drey/storage.h"
#include "storage_internal.h"

static void iso_time(int64_t ms, char *buf, size_t cap) {
    time_t sec = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&sec, &tm);
    size_t n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, cap - n, ".%03dZ", (int)(ms % 1000));
}

/* n bytes as a JSON string; NUL (which internal keys contain) as \u0000. */
static void json_string(FILE *out, const char *s, size_t n) {
    fputc('"', out);
    for (size_t i = 0; i < n;) {
        const char *nul = memchr(s + i, '\0', n - i);
        size_t run = nul != NULL ? (size_t)(nul - (s + i)) : n - i;
        char tmp[2048], esc[8192];
        size_t len = run < sizeof tmp - 1 ? run : sizeof tmp - 1;
        memcpy(tmp, s + i, len);
        tmp[len] = '\0';
        size_t e = drey_log_json_escape(esc, 0, sizeof esc - 1, tmp);
        fwrite(esc, 1, e < sizeof esc ? e : sizeof esc - 1, out);
        i += len;
        if (nul != NULL && i < n && s[i] == '\0') {
            fputs("\\u0000", out);
            i++;
        }
    }
    fputc('"', out);
}

typedef struct report {
    FILE *out;
    bool damaged;
    uint64_t manifest_lsn;
} report;

static void show_manifest(drey_io *io, const char *dir, report *r) {
    char snap[256];
    int rc = drey_storage__read_manifest(io, dir, snap, sizeof snap, &r->manifest_lsn);
    if (rc == -ENOENT) {
        fprintf(r->out, "manifest: none (no snapshot yet)\n");
    } else if (rc != 0) {
        fprintf(r->out, "manifest: DAMAGED (%s/CURRENT)\n", dir);
        r->damaged = true;
    } else if (snap[0] == '\0') {
        fprintf(r->out, "manifest: no snapshot\n");
    } else {
        fprintf(r->out, "manifest: %s (lsn %" PRIu64 ")\n", snap, r->manifest_lsn);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, snap);
        drey_snapshot_info info;
        char err[512];
        if (drey_snapshot_read(io, path, NULL, NULL, &info, err, sizeof err) != 0) {
            fprintf(r->out, "  the snapshot it names is DAMAGED: %s\n", err);
            r->damaged = true;
        }
    }
}

static void show_snapshots(drey_io *io, const char *dir, report *r) {
    char **names;
    size_t n = drey_storage__list_snapshots(io, dir, &names);
    fprintf(r->out, "snapshots: %zu\n", n);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/snapshots/%s", dir, names[i]);
        drey_snapshot_info info;
        char err[512];
        if (drey_snapshot_read(io, path, NULL, NULL, &info, err, sizeof err) == 0)
            fprintf(r->out, "  %s  lsn %" PRIu64 "  entries %" PRIu64 "  bytes %" PRIu64 "  ok\n", names[i], info.lsn,
                    info.entries, info.bytes);
        else
            fprintf(r->out, "  %s  DAMAGED: %s\n", names[i], err);
    }
    drey_io_free_names(names, n);
}

static int show_journal(drey_io *io, const char *dir, report *r, drey_journal_replay_fn fn, void *ctx) {
    drey_journal_scan scan;
    int rc = drey_journal_scan_dir(io, dir, r->manifest_lsn, fn, ctx, &scan);
    if (rc != 0) {
        fprintf(r->out, "journal: cannot be read: %s\n", rc < 0 ? strerror(-rc) : "a record failed");
        r->damaged = true;
        drey_journal_scan_free(&scan);
        return rc;
    }
    fprintf(r->out, "journal segments: %zu\n", scan.n_segments);
    for (size_t i = 0; i < scan.n_segments; i++) {
        drey_journal_segment_info *s = &scan.segments[i];
        fprintf(r->out, "  %s  lsn %" PRIu64 "..%" PRIu64 "  records %" PRIu64 "  bytes %" PRIu64 "  ", s->name,
                s->first_lsn, s->last_lsn, s->records, s->file_bytes);
        if (s->problem == DREY_JOURNAL_OK)
            fprintf(r->out, "ok\n");
        else
            fprintf(r->out, "%s at offset %" PRIu64 "\n", drey_journal_problem_name(s->problem), s->problem_offset);
    }
    fprintf(r->out, "journal: last lsn %" PRIu64 "\n", scan.last_lsn);
    if (scan.problem == DREY_JOURNAL_TORN_TAIL) {
        fprintf(r->out, "note: %s (a crash interrupted the last write; dreyd cuts it at start)\n", scan.message);
    } else if (scan.problem != DREY_JOURNAL_OK) {
        fprintf(r->out, "DAMAGE: %s\n", scan.message);
        r->damaged = true;
    }
    drey_journal_scan_free(&scan);
    return 0;
}

static int dump_record(void *ctx, const drey_journal_record *rec) {
    FILE *out = ctx;
    char when[40];
    iso_time(rec->time_ms, when, sizeof when);
    Drey__Journal__V1__JournalRecord *jr = drey__journal__v1__journal_record__unpack(NULL, rec->len, rec->payload);
    if (jr == NULL) {
        fprintf(out, "{\"lsn\":%" PRIu64 ",\"time\":\"%s\",\"error\":\"undecodable record\"}\n", rec->lsn, when);
        return 0;
    }
    fprintf(out, "{\"lsn\":%" PRIu64 ",\"time\":\"%s\",\"method\":", rec->lsn, when);
    json_string(out, jr->method, strlen(jr->method));
    fprintf(out, ",\"principal\":");
    json_string(out, jr->principal, strlen(jr->principal));
    fprintf(out, ",\"request_id\":");
    json_string(out, jr->request_id, strlen(jr->request_id));
    if (jr->tenant[0] != '\0') {
        fprintf(out, ",\"tenant\":");
        json_string(out, jr->tenant, strlen(jr->tenant));
    }
    if (jr->copy)
        fprintf(out, ",\"copy\":true"); /* a backup's copy of its primary's record */
    fprintf(out, ",\"request_bytes\":%zu}\n", jr->request.len);
    drey__journal__v1__journal_record__free_unpacked(jr, NULL);
    return 0;
}

static void dump_entry(void *ctx, const drey_store_item *it) {
    FILE *out = ctx;
    fprintf(out, "{\"cache\":");
    json_string(out, it->cache, it->cache_len);
    fprintf(out, ",\"key\":");
    json_string(out, it->key, it->key_len);
    fprintf(out, ",\"version\":%" PRIu64 ",\"kind\":%d,\"value_bytes\":%u", it->entry.version,
            (int)it->entry.value.kind, it->entry.value.len);
    if (it->tenant_name_len > 0) {
        fprintf(out, ",\"tenant\":");
        json_string(out, it->tenant_name, it->tenant_name_len);
    }
    if (it->entry.expires_at_ms != 0) {
        char when[40];
        iso_time(it->entry.expires_at_ms, when, sizeof when);
        fprintf(out, ",\"expires_at\":\"%s\"", when);
    }
    fprintf(out, "}\n");
}

static int usage(FILE *err) {
    fprintf(err, "usage: dreyd storage inspect|verify|dump|repair <data directory>\n"
                 "  inspect  manifest, snapshots and journal segments with their LSN ranges\n"
                 "  verify   the same; exit 1 if anything is damaged\n"
                 "  dump     every snapshot entry and journal record, one JSON object per line\n"
                 "  repair   cut the journal at its first damaged frame (drops what follows)\n");
    return 2;
}

/* Cuts the journal at its first problem, saying what goes. */
static int repair(drey_io *io, const char *dir, FILE *out, FILE *err) {
    char snap[256];
    uint64_t manifest_lsn = 0;
    drey_storage__read_manifest(io, dir, snap, sizeof snap, &manifest_lsn);
    drey_journal_scan scan;
    int rc = drey_journal_scan_dir(io, dir, manifest_lsn, NULL, NULL, &scan);
    if (rc != 0) {
        fprintf(err, "dreyd storage repair: cannot read the journal: %s\n", strerror(-rc));
        drey_journal_scan_free(&scan);
        return 1;
    }
    if (scan.problem == DREY_JOURNAL_OK) {
        fprintf(out, "repair: the journal is intact; nothing to do\n");
        drey_journal_scan_free(&scan);
        return 0;
    }
    drey_journal_segment_info *si = &scan.segments[scan.problem_segment];
    fprintf(out, "repair: %s\n", scan.message);
    fprintf(out,
            "repair: keeping records up to lsn %" PRIu64 "; dropping the rest of %s from offset %" PRIu64
            " (%" PRIu64 " bytes) and %zu later segment(s)\n",
            scan.last_lsn, si->name, si->problem_offset, si->file_bytes - si->problem_offset,
            scan.n_segments - scan.problem_segment - 1);
    uint64_t dropped;
    rc = drey_journal_repair(io, dir, &scan, &dropped);
    drey_journal_scan_free(&scan);
    if (rc != 0) {
        fprintf(err, "dreyd storage repair: failed: %s\n", strerror(-rc));
        return 1;
    }
    fprintf(out, "repair: done; %" PRIu64 " segment file(s) deleted\n", dropped);
    return 0;
}

int drey_storage_tool(int argc, char **argv, FILE *out, FILE *err) {
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(out);
            fprintf(out, "Exit status: 0 done; 1 damaged (verify) or failed; 2 usage.\n");
            return 0;
        }
    }
    if (argc != 2)
        return usage(err);
    const char *cmd = argv[0], *dir = argv[1];
    drey_io *io = drey_io_posix();
    report r = {.out = out};
    if (strcmp(cmd, "inspect") == 0 || strcmp(cmd, "verify") == 0) {
        fprintf(out, "data directory: %s\n", dir);
        show_manifest(io, dir, &r);
        show_snapshots(io, dir, &r);
        show_journal(io, dir, &r, NULL, NULL);
        if (strcmp(cmd, "verify") == 0) {
            fprintf(out, "%s\n", r.damaged ? "verify: DAMAGED" : "verify: ok");
            return r.damaged ? 1 : 0;
        }
        return 0;
    }
    if (strcmp(cmd, "dump") == 0) {
        char snap[256];
        if (drey_storage__read_manifest(io, dir, snap, sizeof snap, &r.manifest_lsn) == 0 && snap[0] != '\0') {
            char path[4096], e[512];
            snprintf(path, sizeof path, "%s/%s", dir, snap);
            drey_snapshot_info info;
            if (drey_snapshot_read(io, path, dump_entry, out, &info, e, sizeof e) != 0) {
                fprintf(err, "dreyd storage dump: %s\n", e);
                return 1;
            }
        }
        drey_journal_scan scan;
        int rc = drey_journal_scan_dir(io, dir, r.manifest_lsn, dump_record, out, &scan);
        bool bad = rc != 0 || (scan.problem != DREY_JOURNAL_OK && scan.problem != DREY_JOURNAL_TORN_TAIL);
        if (bad)
            fprintf(err, "dreyd storage dump: %s\n", scan.message[0] ? scan.message : "cannot read the journal");
        drey_journal_scan_free(&scan);
        return bad ? 1 : 0;
    }
    if (strcmp(cmd, "repair") == 0) {
        /* Never behind a running node's back. */
        char lock[4096];
        snprintf(lock, sizeof lock, "%s/LOCK", dir);
        int lock_fd = io->ops->lock(io, lock);
        if (lock_fd < 0) {
            fprintf(err, "dreyd storage repair: %s: %s\n", lock,
                    lock_fd == -EWOULDBLOCK ? "a running dreyd holds this directory; stop it first"
                                            : strerror(-lock_fd));
            return 1;
        }
        int code = repair(io, dir, out, err);
        io->ops->close(io, lock_fd);
        return code;
    }
    return usage(err);
}
