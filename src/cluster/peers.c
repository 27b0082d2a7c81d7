/*
 * peers — unary calls to other nodes' internal listeners.
 *
 * One channel per peer, made on first use with this node's certificate and
 * the pinned cluster CA; the target name checked against the peer's
 * certificate is its node id (not its address), so a node answers only for
 * the id it was issued. One completion queue and thread serve every call;
 * a call is one batch of the six client ops, so it completes with one event.
 *
 * Certificates rotate without a restart: the files are checked (at most once
 * a second) before a call, and when one changed every channel is dropped
 * and made again with the new files on next use.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/log.h"
#include "drey/pem.h"
#include "internal.h"

#define MAX_PEERS 256
#define CHECK_FILES_NS 1000000000LL

typedef struct peer {
    char *id, *address;
    grpc_channel *channel;
} peer;

struct drey_cluster__peers {
    drey_pem_files files; /* cert, key, ca */
    int64_t checked_ns;
    grpc_channel_credentials *creds;
    pthread_mutex_t mu;
    peer peers[MAX_PEERS];
    size_t n;
    grpc_completion_queue *cq;
    pthread_t thread;
};

typedef struct drey_cluster__pcall {
    _Atomic int refs; /* the completion's and the handle's */
    grpc_call *call;
    grpc_byte_buffer *send, *recv;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code code;
    grpc_slice details;
    void (*done)(void *arg, const drey_answer *a);
    void *arg;
} pcall;

static void pcall_unref(pcall *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    grpc_slice_unref(c->details);
    grpc_metadata_array_destroy(&c->initial_md);
    grpc_metadata_array_destroy(&c->trailing_md);
    grpc_byte_buffer_destroy(c->send);
    if (c->recv != NULL)
        grpc_byte_buffer_destroy(c->recv);
    grpc_call_unref(c->call);
    free(c);
}

void drey_cluster__pcall_cancel(drey_cluster__pcall *c) {
    grpc_call_cancel(c->call, NULL);
    pcall_unref(c);
}

void drey_cluster__pcall_release(drey_cluster__pcall *c) {
    pcall_unref(c);
}

/* New credentials from the files; NULL with err when they do not load.
 * Either way the files' identities are kept: a rotation that does not load
 * is not retried (and logged) until the files change again. */
static grpc_channel_credentials *load_creds(drey_cluster__peers *p, const drey_pem_id ids[3], char *err, size_t cap) {
    drey_pem_files_keep(&p->files, ids);
    char *pem[3];
    if (!drey_pem_files_read(&p->files, pem, err, cap))
        return NULL;
    grpc_ssl_pem_key_cert_pair pair = {.private_key = pem[1], .cert_chain = pem[0]};
    grpc_channel_credentials *creds = grpc_ssl_credentials_create(pem[2], &pair, NULL, NULL);
    drey_pem_free(pem);
    if (creds == NULL)
        snprintf(err, cap, "grpc refused the peer certificate, key or CA");
    return creds;
}

static void *peers_main(void *arg) {
    drey_cluster__peers *p = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(p->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            return NULL;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        pcall *c = ev.tag;
        drey_answer a = {.code = c->code};
        char *msg = grpc_slice_to_c_string(c->details);
        a.message = msg;
        a.message_len = strlen(msg);
        for (size_t i = 0; i < c->trailing_md.count; i++) {
            const grpc_metadata *m = &c->trailing_md.metadata[i];
            if (grpc_slice_str_cmp(m->key, "grpc-status-details-bin") == 0) {
                a.details = GRPC_SLICE_START_PTR(m->value);
                a.details_len = GRPC_SLICE_LENGTH(m->value);
            }
        }
        grpc_slice body = grpc_empty_slice();
        if (c->code == GRPC_STATUS_OK && c->recv != NULL) {
            grpc_byte_buffer_reader r;
            if (grpc_byte_buffer_reader_init(&r, c->recv)) {
                body = grpc_byte_buffer_reader_readall(&r);
                grpc_byte_buffer_reader_destroy(&r);
            }
            a.response = GRPC_SLICE_START_PTR(body);
            a.response_len = GRPC_SLICE_LENGTH(body);
        } else if (c->code == GRPC_STATUS_OK) {
            a.code = GRPC_STATUS_INTERNAL; /* OK without a message: not an answer */
        }
        c->done(c->arg, &a);
        grpc_slice_unref(body);
        gpr_free(msg);
        pcall_unref(c);
    }
}

drey_cluster__peers *drey_cluster__peers_create(const char *cert, const char *key, const char *ca, char *err,
                                                size_t err_cap) {
    if (cert == NULL || cert[0] == '\0' || key == NULL || key[0] == '\0' || ca == NULL || ca[0] == '\0') {
        snprintf(err, err_cap, "a cluster node needs --internal-tls-cert, --internal-tls-key and --internal-tls-ca");
        return NULL;
    }
    drey_cluster__peers *p = drey_xcalloc(1, sizeof *p);
    drey_pem_files_init(&p->files, cert, key, ca);
    grpc_init();
    drey_pem_id ids[3];
    drey_pem_files_changed(&p->files, ids);
    p->creds = load_creds(p, ids, err, err_cap);
    if (p->creds == NULL) {
        drey_pem_files_free(&p->files);
        free(p);
        grpc_shutdown();
        return NULL;
    }
    p->checked_ns = drey_mono_ns();
    pthread_mutex_init(&p->mu, NULL);
    p->cq = grpc_completion_queue_create_for_next(NULL);
    if (pthread_create(&p->thread, NULL, peers_main, p) != 0)
        abort();
    return p;
}

static void drop_channels_locked(drey_cluster__peers *p) {
    for (size_t i = 0; i < p->n; i++) {
        grpc_channel_destroy(p->peers[i].channel);
        free(p->peers[i].id);
        free(p->peers[i].address);
    }
    p->n = 0;
}

void drey_cluster__peers_destroy(drey_cluster__peers *p) {
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    drop_channels_locked(p);
    pthread_mutex_unlock(&p->mu);
    /* Calls still in flight complete (cancelled by the channels' end)
     * before the queue reports its shutdown. */
    grpc_completion_queue_shutdown(p->cq);
    pthread_join(p->thread, NULL);
    grpc_completion_queue_destroy(p->cq);
    grpc_channel_credentials_release(p->creds);
    drey_pem_files_free(&p->files);
    pthread_mutex_destroy(&p->mu);
    free(p);
    grpc_shutdown();
}

/* Reloads the credentials when a file changed; needs p->mu. */
static void check_files_locked(drey_cluster__peers *p) {
    int64_t now = drey_mono_ns();
    if (now - p->checked_ns < CHECK_FILES_NS)
        return;
    p->checked_ns = now;
    drey_pem_id ids[3];
    if (!drey_pem_files_changed(&p->files, ids))
        return;
    char err[256];
    grpc_channel_credentials *creds = load_creds(p, ids, err, sizeof err);
    if (creds == NULL) {
        DREY_LOG_WARN("peer certificates changed but do not load; keeping the previous ones",
                      DREY_LOG_STR("error", err));
        return;
    }
    grpc_channel_credentials_release(p->creds);
    p->creds = creds;
    drop_channels_locked(p);
    DREY_LOG_INFO("peer certificates reloaded");
}

static grpc_channel *channel_locked(drey_cluster__peers *p, const char *id, const char *address) {
    check_files_locked(p);
    for (size_t i = 0; i < p->n; i++) {
        if (strcmp(p->peers[i].id, id) == 0) {
            if (strcmp(p->peers[i].address, address) == 0)
                return p->peers[i].channel;
            /* The peer moved (a rescheduled pod): a new channel. */
            grpc_channel_destroy(p->peers[i].channel);
            free(p->peers[i].id);
            free(p->peers[i].address);
            p->peers[i] = p->peers[--p->n];
            break;
        }
    }
    if (p->n == MAX_PEERS)
        drop_channels_locked(p);
    grpc_arg args[3];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_STRING;
    args[0].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
    args[0].value.string = (char *)id;
    /* A peer's answer is relayed as it came: no transparent retries. */
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_ENABLE_RETRIES;
    args[1].value.integer = 0;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[2].value.integer = -1;
    grpc_channel_args cargs = {.num_args = 3, .args = args};
    peer *pe = &p->peers[p->n++];
    pe->id = drey_xstrdup(id);
    pe->address = drey_xstrdup(address);
    pe->channel = grpc_channel_create(address, p->creds, &cargs);
    return pe->channel;
}

drey_cluster__pcall *drey_cluster__peers_call(drey_cluster__peers *p, const char *id, const char *address,
                                              const char *path,
                              const uint8_t *request, size_t len, const drey_cluster__header *headers,
                              size_t n_headers, int64_t deadline_mono_ns,
                              void (*done)(void *arg, const drey_answer *a), void *arg) {
    pcall *c = drey_xcalloc(1, sizeof *c);
    atomic_store(&c->refs, 2);
    c->done = done;
    c->arg = arg;
    grpc_metadata_array_init(&c->initial_md);
    grpc_metadata_array_init(&c->trailing_md);
    gpr_timespec deadline = gpr_inf_future(GPR_CLOCK_MONOTONIC);
    if (deadline_mono_ns != INT64_MAX) {
        int64_t left = deadline_mono_ns - drey_mono_ns();
        deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_nanos(left > 0 ? left : 0, GPR_TIMESPAN));
    }
    pthread_mutex_lock(&p->mu);
    grpc_channel *ch = channel_locked(p, id, address);
    grpc_slice method = grpc_slice_from_copied_string(path);
    c->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, p->cq, method, NULL, deadline, NULL);
    pthread_mutex_unlock(&p->mu);
    grpc_slice_unref(method);

    grpc_slice body = grpc_slice_from_copied_buffer((const char *)request, len);
    c->send = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    grpc_metadata md[8];
    size_t n_md = n_headers < 8 ? n_headers : 8;
    for (size_t i = 0; i < n_md; i++) {
        md[i] = (grpc_metadata){0};
        md[i].key = grpc_slice_from_static_string(headers[i].key);
        md[i].value = grpc_slice_from_copied_buffer(headers[i].value, headers[i].len);
    }
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = n_md;
    ops[0].data.send_initial_metadata.metadata = md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = c->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &c->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &c->trailing_md;
    ops[5].data.recv_status_on_client.status = &c->code;
    ops[5].data.recv_status_on_client.status_details = &c->details;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, 6, c, NULL);
    for (size_t i = 0; i < n_md; i++)
        grpc_slice_unref(md[i].value);
    if (e != GRPC_CALL_OK) {
        DREY_LOG_ERROR("starting a peer call failed", DREY_LOG_STR("error", grpc_call_error_to_string(e)));
        abort();
    }
    return c;
}
