// plot.c: `mtrain plot LOG_DIR`: PNG plots of a run's LOG_DIR/metrics.jsonl
// with gnuplot: loss.png (training and validation loss), throughput.png
// (tokens/s and MFU) and, when the run logged sparse attention statistics,
// density.png (mean attention density over layers), all against the step.
#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../dist/util.h"
#include "args.h"
#include "commands.h"
#include "eval.h"

// One numeric field of a metrics line, NAN when absent.
static double field(const cJSON *line, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(line, name);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

// The mean of a numeric array field, NAN when absent or empty.
static double field_mean(const cJSON *line, const char *name) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(line, name), *v;
    double sum = 0;
    int n = 0;
    cJSON_ArrayForEach(v, a) if (cJSON_IsNumber(v)) sum += v->valuedouble, n++;
    return n ? sum / n : NAN;
}

// The series of metrics.jsonl as gnuplot data blocks ($train: step loss
// tokens/s mfu; $val: step val_loss; $density: step density). Returns the
// number of training lines; *has_val / *has_density say whether those blocks
// have rows. Bad lines stop with file and line.
static int write_series(FILE *gp, const char *path, bool *has_val, bool *has_density) {
    FILE *f = xfopen(path, "r");
    char *text = NULL;
    size_t cap = 0;
    int number = 0, rows = 0;
    char *blocks[3] = {NULL, NULL, NULL};
    size_t sizes[3] = {0, 0, 0};
    FILE *out[3];
    for (int b = 0; b < 3; b++) out[b] = open_memstream(&blocks[b], &sizes[b]);
    *has_val = *has_density = false;
    while (getline(&text, &cap, f) > 0) {
        number++;
        cJSON *line = cJSON_Parse(text);
        double step = line ? field(line, "step") : NAN;
        if (!line || isnan(step)) fail("%s:%d: not a metrics line (expected a JSON object with \"step\")", path, number);
        double loss = field(line, "loss"), val = field(line, "val_loss"), density = field_mean(line, "attention_density");
        if (!isnan(loss)) {
            double mfu = field(line, "mfu");
            fprintf(out[0], "%.0f %.9g %.9g %.9g\n", step, loss, field(line, "tokens_per_s"), isnan(mfu) ? 0 : 100 * mfu);
            rows++;
        }
        if (!isnan(val)) fprintf(out[1], "%.0f %.9g\n", step, val), *has_val = true;
        if (!isnan(density)) fprintf(out[2], "%.0f %.9g\n", step, density), *has_density = true;
        cJSON_Delete(line);
    }
    free(text);
    fclose(f);
    const char *names[3] = {"$train", "$val", "$density"};
    for (int b = 0; b < 3; b++) {
        fclose(out[b]);
        fprintf(gp, "%s << EOD\n%sEOD\n", names[b], blocks[b]);
        free(blocks[b]);
    }
    return rows;
}

static void rename_png(const char *dir, const char *name) {
    char tmp[4096], path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s/%s.tmp", dir, name);
    rename_into_place(tmp, path);
}

int cmd_plot(int argc, char **argv) {
    const char *usage = "usage: mtrain plot LOG_DIR   (PNG plots of LOG_DIR/metrics.jsonl)";
    if (args_refused(args_parse(NULL, 0, argc, argv, argc), usage)) return 2;
    if (argc != 1) {
        fprintf(stderr, "%s\n", usage);
        return 2;
    }
    const char *dir = argv[0];
    char path[4096];
    snprintf(path, sizeof(path), "%s/metrics.jsonl", dir);
    FILE *probe = fopen(path, "r");
    if (!probe) fail("%s: cannot read it (expected the log.dir of a run, holding metrics.jsonl)", path);
    fclose(probe);
    char *series = NULL;
    size_t series_size = 0;
    FILE *data = open_memstream(&series, &series_size);
    bool has_val, has_density;
    int rows = write_series(data, path, &has_val, &has_density);
    fclose(data);
    if (rows == 0) fail("%s: no training steps in it (expected lines with \"loss\")", path);
    void (*old_pipe)(int) = signal(SIGPIPE, SIG_IGN);
    FILE *gp = popen("gnuplot", "w");
    if (!gp) fail("plot: cannot run gnuplot (expected it on PATH: scripts/install_deps.sh installs it)");
    fputs(series, gp);
    free(series);
    fprintf(gp, "set terminal pngcairo size 900,600\nset grid\nset xlabel 'step'\n");
    gp_output(gp, dir, "loss.png");
    fprintf(gp, "set title 'loss'\nset ylabel 'cross entropy (nats per token)'\n"
                "plot $train using 1:2 with lines lw 2 title 'train'%s\n",
            has_val ? ", $val using 1:2 with linespoints lw 2 pt 7 title 'validation'" : "");
    gp_output(gp, dir, "throughput.png");
    fprintf(gp, "set title 'throughput'\nset ylabel 'tokens/s'\nset y2label 'MFU (%%)'\nset y2tics\nset ytics nomirror\n"
                "plot $train using 1:3 with lines lw 2 title 'tokens/s', $train using 1:4 axes x1y2 with lines lw 2 "
                "title 'MFU (%%)'\nunset y2tics\nunset y2label\nset ytics mirror\n");
    if (has_density) {
        gp_output(gp, dir, "density.png");
        fprintf(gp, "set title 'sparse attention density (mean over layers)'\nset ylabel 'computed / causal'\nset yrange [0:1.05]\n"
                    "plot $density using 1:2 with linespoints lw 2 pt 7 notitle\n");
    }
    fprintf(gp, "set output\n");
    int status = pclose(gp);
    signal(SIGPIPE, old_pipe);
    if (status != 0) fail("plot: gnuplot failed (status %d); no PNG written", status);
    rename_png(dir, "loss.png");
    rename_png(dir, "throughput.png");
    if (has_density) rename_png(dir, "density.png");
    printf("plot: %d steps: %s/loss.png, %s/throughput.png%s%s%s\n", rows, dir, dir, has_density ? ", " : "",
           has_density ? dir : "", has_density ? "/density.png" : "");
    return 0;
}
