# Shared by run_tax_model_sims.sh and run_heldout_sims.sh (sourced, not run): after the caller
# sets `date` and `out` (where the reports go), finds vamp-sim, reads VAMP_SIM_ARGS and defines
# run NAME TITLE ARGS..., which replays one workload under every policy the suites compare and
# writes $out/sim-$date-tax-NAME.md with its charts.
sim=${VAMP_SIM:-build/release/sim/vamp-sim}
[[ -x $sim ]] || bash scripts/build.sh vamp-sim
mkdir -p "$out"
read -r -a extra <<< "${VAMP_SIM_ARGS:-}"
pol="static,vamp-10,vamp-15,vamp-25,vamp-15+paper,vamp-25+paper"
run() {  # NAME TITLE ARGS...
  local name=$1 title=$2
  shift 2
  echo "==> $name" >&2
  "$sim" --progress=false "--policies=$pol" "--title=$title" \
    "--report=$out/sim-$date-tax-$name.md" "$@" ${extra[@]+"${extra[@]}"} > /dev/null
}
