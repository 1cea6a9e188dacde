// test_args.c: the verbs' option parser (trainer/args.h): options in any
// order among the other arguments, flags, lists, the stop at the first
// argument past the kept ones, a missing value, an unknown option, the help
// detector.
#include <string.h>

#include "../../trainer/args.h"
#include "../lib/check.h"

int main(void) {
    const char *model = NULL, *seed = NULL;
    bool ids = false;
    const ArgOption options[] = {{"--model", ARG_VALUE, &model}, {"--ids", ARG_FLAG, &ids}, {"--seed", ARG_VALUE, &seed}};
    const int n = (int)(sizeof(options) / sizeof(options[0]));

    char *mixed[] = {"run.yaml", "--seed", "7", "a.b=1", "--ids", "--model", "m", "c.d=2"};
    ArgsResult r = args_parse(options, n, 8, mixed, 8);
    EXPECT(r.kept == 3 && r.rest == 8 && !r.missing && !r.unknown && !strcmp(mixed[0], "run.yaml") &&
               !strcmp(mixed[1], "a.b=1") && !strcmp(mixed[2], "c.d=2") && ids && !strcmp(model, "m") &&
               !strcmp(seed, "7"),
           "options anywhere: values and flag read, the others kept in order (kept %d, rest %d)", r.kept, r.rest);

    model = NULL;
    char *stop[] = {"--model", "m", "x.y=1", "--seed", "9"};
    r = args_parse(options, n, 5, stop, 0);
    EXPECT(r.kept == 0 && r.rest == 2 && model && !strcmp(model, "m") && !strcmp(seed, "7"),
           "max_kept 0: stops at the first other argument, options after it unread (rest %d)", r.rest);

    char *two[] = {"src", "--seed", "3", "out", "model.x=1", "--seed", "4"};
    r = args_parse(options, n, 7, two, 2);
    EXPECT(r.kept == 2 && r.rest == 4 && !strcmp(two[0], "src") && !strcmp(two[1], "out") && !strcmp(seed, "3"),
           "max_kept 2: two kept, the third other argument starts the rest (rest %d)", r.rest);

    char *missing[] = {"run.yaml", "--model"};
    r = args_parse(options, n, 2, missing, 2);
    EXPECT(r.missing && !strcmp(r.missing, "--model") && !r.unknown, "an option last without its value: missing");

    char *unknown[] = {"--model", "m", "--bogus", "x"};
    r = args_parse(options, n, 4, unknown, 0);
    EXPECT(r.unknown && !strcmp(r.unknown, "--bogus") && !r.missing, "an argument beginning with '--' that is no option: unknown");
    char *short_unknown[] = {"src", "-x", "out"};
    r = args_parse(options, n, 3, short_unknown, 2);
    EXPECT(r.unknown && !strcmp(r.unknown, "-x") && r.kept == 1, "one beginning with '-': unknown too (kept %d)", r.kept);
    char *after_rest[] = {"x.y=1", "--bogus"};
    r = args_parse(options, n, 2, after_rest, 0);
    EXPECT(!r.unknown && r.rest == 0, "past the kept arguments nothing is read (rest %d)", r.rest);

    const char *out = NULL;
    char *list_args[] = {"--input", "a", "-b", "--out", "o", "--input", "c"};
    ArgList inputs = {(const char **)list_args, 0};  // in place: nothing kept
    const ArgOption list_options[] = {{"--input", ARG_LIST, &inputs}, {"--out", ARG_VALUE, &out}};
    r = args_parse(list_options, 2, 7, list_args, 0);
    EXPECT(r.rest == 7 && !r.missing && inputs.count == 3 && !strcmp(inputs.values[0], "a") &&
               !strcmp(inputs.values[1], "-b") && !strcmp(inputs.values[2], "c") && !strcmp(out, "o"),
           "a list runs to the next '--' argument and its uses add up (count %d)", inputs.count);

    char *empty_list[] = {"--input", "--out", "o"};
    inputs.count = 0;
    r = args_parse(list_options, 2, 3, empty_list, 0);
    EXPECT(r.missing && !strcmp(r.missing, "--input") && inputs.count == 0, "a list followed by an option: missing");

    EXPECT(args_help(1, (char *[]){"--help"}) && args_help(1, (char *[]){"-h"}) &&
               args_help(3, (char *[]){"run.yaml", "--help", "x"}),
           "-h or --help anywhere asks for help");
    EXPECT(!args_help(1, (char *[]){"--helpx"}) && !args_help(2, (char *[]){"x", "-hh"}) && !args_help(0, NULL),
           "anything else does not ask for help");
    return check_exit();
}
