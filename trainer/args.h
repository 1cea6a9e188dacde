// args.h: the one parser of the verbs' options (score, generate, export,
// plan, tasks, tokenize, detokenize, shard, data): a table of options, each a
// flag, an option with a value or an option with a list of values; the verb
// keeps its own usage and messages.
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
// or an ARG_LIST option followed by none (missing), or an argument beginning with reject_prefix that is no option
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

// Whether argv is exactly "-h" or "--help": how main.c calls a verb with its
// own usage when the command line asks for help.
bool args_help(int argc, char **argv);

#endif
