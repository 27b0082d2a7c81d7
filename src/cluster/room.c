/*
 * room — the admission arithmetic for backups and the lease's; see room.h.
 */
#include "room.h"

static bool stale(const drey_cluster__room_seen *s) {
    return s->since_heard_ns > DREY_CLUSTER_ROOM_FRESH_NS && s->sent_journal == 0;
}

int64_t drey_cluster__room_memory_left(const drey_cluster__room_seen *s) {
    if (stale(s) || s->memory == INT64_MAX)
        return INT64_MAX;
    return s->sent_memory >= s->memory ? 0 : s->memory - s->sent_memory;
}

drey_error drey_cluster__room_verdict(const drey_cluster__room_seen *s, uint64_t journal_need, int64_t memory_need,
                                      uint64_t *have) {
    if (stale(s))
        return DREY_ERR_NONE;
    if (s->journal != UINT64_MAX && (s->sent_journal >= s->journal || journal_need > s->journal - s->sent_journal)) {
        *have = s->sent_journal >= s->journal ? 0 : s->journal - s->sent_journal;
        return DREY_ERR_JOURNAL_DISK_QUOTA;
    }
    int64_t m = drey_cluster__room_memory_left(s);
    if (memory_need > 0 && memory_need > m) {
        *have = (uint64_t)m;
        return DREY_ERR_MEMORY_PRESSURE;
    }
    return DREY_ERR_NONE;
}

bool drey_cluster__lease_holds(int64_t valid_until_ns, int64_t margin_ns, int64_t now_ns) {
    return valid_until_ns != 0 && now_ns < valid_until_ns - margin_ns;
}

bool drey_cluster__may_lead_at(bool lease_holds, int64_t revision, int64_t registered) {
    return lease_holds && revision >= registered;
}

int64_t drey_cluster__grant_until(int64_t sent_ns, int64_t lease_ns, int64_t margin_ns) {
    return sent_ns + lease_ns - margin_ns;
}

bool drey_cluster__backups_grant(const int64_t *until_ns, size_t n, int64_t now_ns) {
    for (size_t i = 0; i < n; i++) {
        if (now_ns >= until_ns[i])
            return false;
    }
    return true;
}

int64_t drey_cluster__serve_from(int64_t granted_ns, int64_t lease_ns, int64_t margin_ns) {
    return granted_ns == 0 ? 0 : granted_ns + lease_ns + margin_ns;
}

bool drey_cluster__release_voids(const drey_cluster__grant *g, uint64_t from, int64_t epoch) {
    return g->at_ns != 0 && g->to == from && g->epoch <= epoch;
}
