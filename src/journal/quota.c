/*
 * The journal disk quota's names (the quota itself lives with the writer in
 * journal.c, which knows where every record will land).
 */
#include "drey/journal.h"

const char *drey_journal_quota_state_name(drey_journal_quota_state s) {
    switch (s) {
    case DREY_JOURNAL_QUOTA_NORMAL: return "normal";
    case DREY_JOURNAL_QUOTA_HIGH: return "high";
    case DREY_JOURNAL_QUOTA_CRITICAL: return "critical";
    }
    return "?";
}
