// commands.h: the CLI verbs of build/mtrain. Each takes the arguments after
// the verb and returns the process exit status.
#ifndef MTRAIN_COMMANDS_H
#define MTRAIN_COMMANDS_H

int cmd_config(int argc, char **argv);    // trainer/config.c
int cmd_train(int argc, char **argv);     // trainer/train.c
int cmd_score(int argc, char **argv);     // trainer/score.c
int cmd_eval(int argc, char **argv);      // trainer/eval.c
int cmd_tokenize(int argc, char **argv);  // trainer/cmd_data.c
int cmd_shard(int argc, char **argv);     // trainer/cmd_data.c
int cmd_data(int argc, char **argv);      // trainer/cmd_data.c
int cmd_detokenize(int argc, char **argv);  // trainer/cmd_data.c
int cmd_export(int argc, char **argv);    // trainer/export.c
int cmd_tasks(int argc, char **argv);     // trainer/eval.c
int cmd_plan(int argc, char **argv);      // trainer/plan.c
int cmd_plot(int argc, char **argv);      // trainer/plot.c
int cmd_generate(int argc, char **argv);  // trainer/generate.c

#endif
