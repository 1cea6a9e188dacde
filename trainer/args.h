// args.h: the one parser of the verbs' options (score, generate, export,
// plan, tasks): a table of options, each a flag or an option with a value;
// the verb keeps its own usage and messages.
#ifndef MTRAIN_ARGS_H
#define MTRAIN_ARGS_H

#include <stdbool.h>

typedef enum {
    ARG_FLAG,   // "--name": *(bool *)dest = true
    ARG_VALUE,  // "--name VALUE": *(const char **)dest = VALUE
} ArgKind;

typedef struct {
    const char *name;  // "--name"
    ArgKind kind;
    void *dest;
} ArgOption;

// What args_parse read: the other arguments moved to argv[0, kept) in
// order; the arguments from argv[rest] on not read (the verb's overrides);
// or the argument that stopped it: an option given last without its value
// (missing), or an argument beginning with reject_prefix that is no option
// (unknown). NULL when none.
typedef struct {
    int kept, rest;
    const char *missing, *unknown;
} ArgsResult;

// Read the options of table options [count] from argv [argc], in any order
// among the other arguments; at the (max_kept + 1)-th other argument, stop
// (rest = its index; else rest = argc). reject_prefix: NULL, or the prefix
// ("-", "--") of arguments that must be options.
ArgsResult args_parse(const ArgOption *options, int count, int argc, char **argv, int max_kept,
                      const char *reject_prefix);

#endif
