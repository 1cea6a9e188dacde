// args.c: the one parser of the verbs' options (args.h).
#include "args.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static const ArgOption *find_option(const ArgOption *options, int count, const char *arg) {
    for (int i = 0; i < count; i++)
        if (!strcmp(options[i].name, arg)) return &options[i];
    return NULL;
}

ArgsResult args_parse(const ArgOption *options, int count, int argc, char **argv, int max_kept) {
    ArgsResult r = {0, argc, NULL, NULL};
    for (int i = 0; i < argc; i++) {
        const ArgOption *o = find_option(options, count, argv[i]);
        if (o && o->kind == ARG_FLAG) {
            *(bool *)o->dest = true;
        } else if (o && o->kind == ARG_LIST) {
            ArgList *list = o->dest;
            const int before = list->count;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) list->values[list->count++] = argv[++i];
            if (list->count == before) {
                r.missing = argv[i];
                return r;
            }
        } else if (o) {
            if (i + 1 >= argc) {
                r.missing = argv[i];
                return r;
            }
            *(const char **)o->dest = argv[++i];
        } else if (argv[i][0] == '-') {
            r.unknown = argv[i];
            return r;
        } else if (r.kept == max_kept) {
            r.rest = i;
            return r;
        } else {
            argv[r.kept++] = argv[i];
        }
    }
    return r;
}

int args_usage_error(const char *usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mtrain: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    size_t n = strlen(usage);
    fprintf(stderr, "\n%s%s", usage, n && usage[n - 1] == '\n' ? "" : "\n");
    return 2;
}

int args_refused(ArgsResult r, const char *usage) {
    if (r.missing) return args_usage_error(usage, "%s needs a value", r.missing);
    if (r.unknown) return args_usage_error(usage, "unknown option '%s'", r.unknown);
    return 0;
}

bool args_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
    return false;
}
