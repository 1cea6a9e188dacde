// fuzz_hf_config.c: libFuzzer target for a Hugging Face config.json.
#include "fuzz.h"
#include "../../model/hf_config.h"

static void read_config_json(const char *path) {
    ModelConfig mc;
    hf_config_read(path, &mc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_read(data, size, ".json", read_config_json);
    return 0;
}
