// args.c: the one parser of the verbs' options (args.h).
#include "args.h"

#include <stddef.h>
#include <string.h>

static const ArgOption *find_option(const ArgOption *options, int count, const char *arg) {
    for (int i = 0; i < count; i++)
        if (!strcmp(options[i].name, arg)) return &options[i];
    return NULL;
}

ArgsResult args_parse(const ArgOption *options, int count, int argc, char **argv, int max_kept,
                      const char *reject_prefix) {
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
        } else if (reject_prefix && !strncmp(argv[i], reject_prefix, strlen(reject_prefix))) {
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

bool args_help(int argc, char **argv) {
    return argc == 1 && (!strcmp(argv[0], "-h") || !strcmp(argv[0], "--help"));
}
