// args.h: the one parser of the verbs' options (score, generate, export,
// plan, tasks, tokenize, detokenize, shard, data): a table of options, each a
// flag, an option with a value or an option with a list of values; the one
// rule for an unknown option or a missing value, and the one help detector
// (main.c). The verb keeps its own usage.
#ifndef MTRAIN_ARGS_H
#define MTRAIN_ARGS_H

#include <stdbool.h>

typedef enum {
    ARG_FLAG,   // "--name": *(bool *)dest = true
    ARG_VALUE,  // "--name VALUE": *(const char **)dest = VALUE
    ARG_LIST,   // "--name VALUE...": the arguments up to the next that begins with "--", appended to *(ArgList *)dest
} ArgKind;

// The values of an ARG_LIST option, over all its uses; values has room for
// argc entries: the caller's array, or argv itself when args_parse keeps no
// argument (max_kept 0): value k then lands in argv[k], already read.
typedef struct {
    const char **values;
    int count;
} ArgList;

typedef struct {
    const char *name;  // "--name"
    ArgKind kind;
    void *dest;
} ArgOption;

// What args_parse read: the other arguments moved to argv[0, kept) in
// order; the arguments from argv[rest] on not read (the verb's overrides);
// or the argument that stopped it: an option given last without its value,
// or an ARG_LIST option followed by none (missing), or an argument beginning
// with "-" that is no option (unknown). NULL when none.
typedef struct {
    int kept, rest;
    const char *missing, *unknown;
} ArgsResult;

// Read the options of table options [count] from argv [argc], in any order
// among the other arguments; at the (max_kept + 1)-th other argument, stop
// (rest = its index; else rest = argc).
ArgsResult args_parse(const ArgOption *options, int count, int argc, char **argv, int max_kept);

// The verbs' one usage error: "mtrain: " and the message, then the verb's
// usage, on stderr. Returns 2, the exit status.
int args_usage_error(const char *usage, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// The verbs' one rule for what stopped args_parse: "mtrain: --x needs a
// value" (missing) or "mtrain: unknown option '--x'" (unknown), then the
// usage (args_usage_error): 2. 0 when neither.
int args_refused(ArgsResult r, const char *usage);

// Whether any of argv is "-h" or "--help": main.c then prints the verb's
// usage (or calls the verb with "--help" alone when it has a longer one).
bool args_help(int argc, char **argv);

#endif
