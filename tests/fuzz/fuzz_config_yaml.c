// fuzz_config_yaml.c: libFuzzer target for the YAML run file: the input is
// loaded as a run file over the defaults, then validated.
#include "fuzz.h"
#include "../../trainer/config.h"

static void read_run_file(const char *path) {
    Config cfg;
    config_defaults(&cfg);
    config_load_yaml(&cfg, path);
    config_validate(&cfg, path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_read(data, size, ".yaml", read_run_file);
    return 0;
}
