/*
 * json — see json.h. JSON numbers become doubles, as google.protobuf.Value
 * has no integer kind; printed back, whole numbers (up to 2^53) show without a
 * fraction and others with 15 significant digits, for reading, not round
 * trips.
 */
#include "json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "drey/alloc.h"

static Google__Protobuf__Struct *struct_of(json_t *obj, drey_arena *a);

static Google__Protobuf__Value *value_of(json_t *j, drey_arena *a) {
    Google__Protobuf__Value *v = drey_arena_alloc(a, sizeof *v);
    google__protobuf__value__init(v);
    switch (json_typeof(j)) {
    case JSON_OBJECT:
        v->kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRUCT_VALUE;
        v->struct_value = struct_of(j, a);
        break;
    case JSON_ARRAY: {
        Google__Protobuf__ListValue *l = drey_arena_alloc(a, sizeof *l);
        google__protobuf__list_value__init(l);
        l->n_values = json_array_size(j);
        l->values = drey_arena_alloc(a, (l->n_values ? l->n_values : 1) * sizeof *l->values);
        for (size_t i = 0; i < l->n_values; i++)
            l->values[i] = value_of(json_array_get(j, i), a);
        v->kind_case = GOOGLE__PROTOBUF__VALUE__KIND_LIST_VALUE;
        v->list_value = l;
        break;
    }
    case JSON_STRING:
        v->kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE;
        v->string_value = drey_arena_strndup(a, json_string_value(j), json_string_length(j));
        break;
    case JSON_INTEGER:
    case JSON_REAL:
        v->kind_case = GOOGLE__PROTOBUF__VALUE__KIND_NUMBER_VALUE;
        v->number_value = json_number_value(j);
        break;
    case JSON_TRUE:
    case JSON_FALSE:
        v->kind_case = GOOGLE__PROTOBUF__VALUE__KIND_BOOL_VALUE;
        v->bool_value = json_is_true(j);
        break;
    case JSON_NULL:
        v->kind_case = GOOGLE__PROTOBUF__VALUE__KIND_NULL_VALUE;
        v->null_value = GOOGLE__PROTOBUF__NULL_VALUE__NULL_VALUE;
        break;
    }
    return v;
}

static Google__Protobuf__Struct *struct_of(json_t *obj, drey_arena *a) {
    Google__Protobuf__Struct *s = drey_arena_alloc(a, sizeof *s);
    google__protobuf__struct__init(s);
    s->fields = drey_arena_alloc(a, (json_object_size(obj) ? json_object_size(obj) : 1) * sizeof *s->fields);
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val) {
        Google__Protobuf__Struct__FieldsEntry *e = drey_arena_alloc(a, sizeof *e);
        google__protobuf__struct__fields_entry__init(e);
        e->key = drey_arena_strndup(a, key, strlen(key));
        e->value = value_of(val, a);
        s->fields[s->n_fields++] = e;
    }
    return s;
}

Google__Protobuf__Struct *drey_cli_json_parse(const char *text, drey_arena *arena, char *err, size_t err_cap) {
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        snprintf(err, err_cap, "invalid JSON at line %d column %d: %s", jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        snprintf(err, err_cap, "a JSON value must be an object");
        json_decref(root);
        return NULL;
    }
    Google__Protobuf__Struct *s = struct_of(root, arena);
    json_decref(root);
    return s;
}

static json_t *json_of_value(const Google__Protobuf__Value *v) {
    if (v == NULL)
        return json_null();
    switch (v->kind_case) {
    case GOOGLE__PROTOBUF__VALUE__KIND_NUMBER_VALUE: {
        double d = v->number_value;
        if (d == trunc(d) && fabs(d) <= 9007199254740992.0)
            return json_integer((json_int_t)d);
        return json_real(d);
    }
    case GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE: return json_string(v->string_value);
    case GOOGLE__PROTOBUF__VALUE__KIND_BOOL_VALUE: return json_boolean(v->bool_value);
    case GOOGLE__PROTOBUF__VALUE__KIND_STRUCT_VALUE: return drey_cli_json_of_struct(v->struct_value);
    case GOOGLE__PROTOBUF__VALUE__KIND_LIST_VALUE: {
        json_t *arr = json_array();
        for (size_t i = 0; v->list_value != NULL && i < v->list_value->n_values; i++)
            json_array_append_new(arr, json_of_value(v->list_value->values[i]));
        return arr;
    }
    default: return json_null();
    }
}

static int by_key(const void *a, const void *b) {
    return strcmp((*(Google__Protobuf__Struct__FieldsEntry *const *)a)->key,
                  (*(Google__Protobuf__Struct__FieldsEntry *const *)b)->key);
}

/* Keys sorted: a Struct is a map, whose order means nothing, and output
 * that does not change from one run to the next is easier to compare. */
json_t *drey_cli_json_of_struct(const Google__Protobuf__Struct *s) {
    json_t *obj = json_object();
    size_t n = s != NULL ? s->n_fields : 0;
    Google__Protobuf__Struct__FieldsEntry **sorted = drey_xcalloc(n, sizeof *sorted);
    if (n > 0)
        memcpy(sorted, s->fields, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, by_key);
    for (size_t i = 0; i < n; i++)
        json_object_set_new(obj, sorted[i]->key, json_of_value(sorted[i]->value));
    free(sorted);
    return obj;
}

void drey_cli_json_print(FILE *out, const Google__Protobuf__Struct *s) {
    json_t *obj = drey_cli_json_of_struct(s);
    char *text = json_dumps(obj, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    fputs(text != NULL ? text : "{}", out);
    free(text);
    json_decref(obj);
}
