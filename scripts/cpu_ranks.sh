# cpu_ranks.sh: sourced by the scripts that run mtrain on several MPI ranks of
# one CPU machine (demo.sh, context_extension.sh): the Open MPI settings that
# needs, and (mtrain divides the cores among the ranks itself)
#   run_ranks RANKS VERB RUN.yaml [section.key=value ...]
# = build/mtrain under mpirun, the ranks forming one context-parallel group
# (each holds 1/RANKS of every sequence); later overrides win.
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_btl_vader_single_copy_mechanism=none
run_ranks() {
  local ranks=$1 verb=$2 run=$3
  shift 3
  mpirun -np "$ranks" --oversubscribe --bind-to none build/mtrain "$verb" "$run" \
    parallel.cp="$ranks" "$@"
}
