// main.c: build/mtrain's entry point: sets the OpenMP wait policy, then
// dispatches the CLI verb.
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
    bool own_help;  // run(1, {"--help"}) prints its longer usage to stdout and returns 0
} Verb;

static const Verb verbs[] = {
    {"train", cmd_train, "train RUN.yaml [section.key=value ...]   train a model", false},
    {"config", cmd_config, "config RUN.yaml [section.key=value ...]  print the resolved config (--doc: the key reference)", false},
    {"plan", cmd_plan, "plan RUN.yaml [--gpu a100-40g|a100-80g|h100|h200] [--density D] [--kernels] [--ring] [section.key=value ...]  memory, FLOPs and step time per rank; does it fit (--kernels: per-kernel derived bounds; --ring: the ring's overlap per layer and step)", false},
    {"plot", cmd_plot, "plot LOG_DIR  loss, throughput (tokens/s, MFU) and attention density vs step as PNG (gnuplot)", false},
    {"eval", cmd_eval, "eval RUN.yaml [section.key=value ...]    perplexity by length, passkey / NIAH / RULER grids (eval.*)", false},
    {"tasks", cmd_tasks, "tasks RUN.yaml --count N --output OUT.jsonl [section.key=value ...]  eval task samples as training text (JSONL)", false},
    {"score", cmd_score, "score --model DIR --tokens FILE [--grads OUT] [--logits OUT] [overrides]  loss (and gradients) of a HF model", false},
    {"tokenize", cmd_tokenize, "tokenize --tokenizer T --input FILE... --output OUT.shard [--threads N] [--text-field NAME] [--frame-tokens N]  pack text into a token shard (T: bytes or a tokenizer.json)", true},
    {"generate", cmd_generate, "generate --model DIR (--prompt TEXT | --tokens FILE) [--max-new N] [--temperature T] [--top-p P] [--top-k K] [--seed S] [--ids] [--tokenizer T] [section.key=value ...]  continue a prompt (KV cache; CPU or CUDA backend)", false},
    {"export", cmd_export, "export CKPT_DIR OUT_DIR [--dtype bf16|f32] [--max-shard-size 5GB] [model.key=value ...]  write a HF folder", false},
    {"detokenize", cmd_detokenize, "detokenize --tokenizer T [FILE]  token ids (one document per line) back to text", true},
    {"data", cmd_data, "data RUN.yaml [--read N] [--show G] [section.key=value ...]  what the loader makes of the run's data", true},
    {"shard", cmd_shard, "shard info|verify|dump FILE [--text [--tokenizer T]]  inspect, check or print a token shard", true},
};

static void usage(FILE *out) {
    fprintf(out, "usage: mtrain VERB ...\n");
    for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++) fprintf(out, "  mtrain %s\n", verbs[i].usage);
}

// OpenMP threads that spin while they wait for work take the CPUs of other
// processes (the other ranks, other jobs), and a step then takes many times
// longer (docs/PERFORMANCE.md). libgomp reads its wait policy once, when it
// is loaded, so unless the user chose one, mtrain starts itself again with
// OMP_WAIT_POLICY=passive (same process, before MPI starts; the binary's
// own path keeps the process name).
static void restart_with_passive_wait(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0 && setenv("OMP_WAIT_POLICY", "passive", 1) == 0) {
        self[n] = '\0';
        execv(self, argv);
    }
    fprintf(stderr, "warning: /proc/self/exe: cannot restart with OMP_WAIT_POLICY=passive (%s); idle OpenMP threads "
            "spin\n", strerror(errno));
}

int main(int argc, char **argv) {
    restart_with_passive_wait(argv);
    if (argc < 2 || args_help(1, argv + 1)) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
        if (!strcmp(argv[1], verbs[i].name)) {
            if (!args_help(argc - 2, argv + 2)) return verbs[i].run(argc - 2, argv + 2);
            if (verbs[i].own_help) return verbs[i].run(1, (char *[]){"--help", NULL});
            printf("usage: mtrain %s\n", verbs[i].usage);
            return 0;
        }
    fprintf(stderr, "mtrain: unknown verb '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
