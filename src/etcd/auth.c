/*
 * auth — etcd's own authentication: a token from Auth/Authenticate, sent as
 * the `token` metadata of every call; see include/drey/etcd.h.
 *
 * Unary calls run on their callers' threads and fetch a token themselves
 * when they have none or theirs was refused. Streams run on the client's
 * thread, which may not make a call: a stream refused UNAUTHENTICATED asks
 * the refresher thread for a new token and is reopened (after its backoff)
 * with whatever token is in force then. A token is fetched once per
 * generation however many calls found the old one refused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/thread.h"
#include "internal.h"

#define REFRESH_TIMEOUT_NS (5 * 1000000000LL)
#define REFRESH_RETRY_NS (1 * 1000000000LL)

size_t drey_etcd__token_md(drey_etcd *e, grpc_metadata *md, uint64_t *gen) {
    if (gen != NULL)
        *gen = 0;
    if (e->user == NULL)
        return 0;
    pthread_mutex_lock(&e->auth_mu);
    size_t n = 0;
    if (e->token != NULL && md == NULL) {
        n = 1;
    } else if (e->token != NULL) {
        memset(md, 0, sizeof *md);
        md->key = grpc_slice_from_static_string("token");
        md->value = grpc_slice_from_copied_string(e->token);
        n = 1;
    }
    if (gen != NULL)
        *gen = e->token_gen;
    pthread_mutex_unlock(&e->auth_mu);
    return n;
}

/* The password: the file's first line. NULL with st set. */
static char *password(drey_etcd *e, drey_etcd_status *st) {
    FILE *f = fopen(e->password_file, "r");
    if (f == NULL) {
        drey_etcd__status_set(st, GRPC_STATUS_FAILED_PRECONDITION, "%s: cannot be read", e->password_file);
        return NULL;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, f);
    fclose(f);
    if (n < 0) {
        free(line);
        return drey_xstrdup("");
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    return line;
}

grpc_status_code drey_etcd__authenticate(drey_etcd *e, uint64_t gen, int64_t deadline_ns, drey_etcd_status *st) {
    pthread_mutex_lock(&e->auth_mu);
    bool fresh = e->token != NULL && e->token_gen > gen;
    pthread_mutex_unlock(&e->auth_mu);
    if (fresh) {
        st->code = GRPC_STATUS_OK;
        st->message[0] = '\0';
        return GRPC_STATUS_OK; /* another caller fetched one meanwhile */
    }
    char *pw = password(e, st);
    if (pw == NULL)
        return st->code;
    Etcdserverpb__AuthenticateRequest req = ETCDSERVERPB__AUTHENTICATE_REQUEST__INIT;
    req.name = e->user;
    req.password = pw;
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    ProtobufCMessage *resp = NULL;
    int64_t left_ms = (deadline_ns - drey_mono_ns()) / 1000000;
    grpc_status_code code = drey_etcd__unary_plain(e, DREY_ETCD__AUTHENTICATE, &req.base,
                                                   &etcdserverpb__authenticate_response__descriptor, true, left_ms,
                                                   &a, &resp, st);
    memset(pw, 0, strlen(pw));
    free(pw);
    if (code == GRPC_STATUS_OK) {
        const Etcdserverpb__AuthenticateResponse *r = (const void *)resp;
        char *tok = drey_xstrdup(r->token != NULL ? r->token : "");
        pthread_mutex_lock(&e->auth_mu);
        free(e->token);
        e->token = tok;
        e->token_gen++;
        e->refresh_wanted = false;
        pthread_mutex_unlock(&e->auth_mu);
    } else {
        char why[sizeof st->message];
        snprintf(why, sizeof why, "%s", st->message);
        drey_etcd__status_set(st, code, "etcd authentication as %.64s failed: %.150s", e->user, why);
    }
    drey_arena_destroy(&a);
    return code;
}

void drey_etcd__token_stale(drey_etcd *e, uint64_t gen) {
    if (e->user == NULL)
        return;
    pthread_mutex_lock(&e->auth_mu);
    if (e->token_gen <= gen) {
        e->refresh_wanted = true;
        pthread_cond_signal(&e->auth_cv);
    }
    pthread_mutex_unlock(&e->auth_mu);
}

static void *refresher(void *arg) {
    drey_etcd *e = arg;
    pthread_mutex_lock(&e->auth_mu);
    while (!e->auth_stopping) {
        if (!e->refresh_wanted) {
            pthread_cond_wait(&e->auth_cv, &e->auth_mu);
            continue;
        }
        uint64_t gen = e->token_gen;
        pthread_mutex_unlock(&e->auth_mu);
        drey_etcd_status st;
        bool ok = drey_etcd__authenticate(e, gen, drey_mono_ns() + REFRESH_TIMEOUT_NS, &st) == GRPC_STATUS_OK;
        pthread_mutex_lock(&e->auth_mu);
        if (!ok && !e->auth_stopping) /* etcd unreachable or refusing: again in a while */
            drey_cond_wait_until(&e->auth_cv, &e->auth_mu, drey_mono_ns() + REFRESH_RETRY_NS);
    }
    pthread_mutex_unlock(&e->auth_mu);
    return NULL;
}

void drey_etcd__auth_start(drey_etcd *e) {
    pthread_mutex_init(&e->auth_mu, NULL);
    pthread_cond_init(&e->auth_cv, NULL);
    if (e->user == NULL)
        return;
    drey_thread_start(&e->auth_thread, "etcd token refresher", refresher, e);
    e->auth_thread_running = true;
}

void drey_etcd__auth_stop(drey_etcd *e) {
    if (e->auth_thread_running)
        drey_thread_stop(e->auth_thread, &e->auth_mu, &e->auth_cv, &e->auth_stopping);
    free(e->token);
    free(e->user);
    free(e->password_file);
    pthread_mutex_destroy(&e->auth_mu);
    pthread_cond_destroy(&e->auth_cv);
}
