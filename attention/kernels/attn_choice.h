// attn_choice.h: the attention kernel variant to run per GPU architecture,
// head dim and kind, as measured by gpu_sweep_attention (the fastest variant
// within the bf16 bound at the sweep's longest causal or sparse shape).
// Written by scripts/sweep_table.sh from a sweep's table (scripts/gpu_check.sh
// leaves it in $OUT/sweep.tsv); rerun that script rather than editing by
// hand. An architecture without rows gets the cost model's choice
// (attn_variant_choose). Row: {arch (major x 10 + minor), head dim, kind,
// variant, TFLOP/s measured, the sweep's device and date}.
#define ATTN_CHOICE_ROWS
