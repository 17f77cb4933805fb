#!/usr/bin/env bash
# Everything the project measures on a lent GPU, in one pass of a short lease (about 9 minutes):
#   1. the CUDA test run (engines agree, fused = autograd, exact resume, thread invariance);
#   2. benchmarks.perf's throughput section on CUDA, cells in one process;
#   3. FedLF Table 9's server steps (FedFV, FedMGDA+, FedMDFG, FedLF at 100 clients, NF-ResNet-18);
#   4. one paper-scale-shaped round per paper;
#   5. both engines against the per-client reference loop on CUDA;
#   6. a profile of the slowest server step;
#   7. FedLF's layer QPs with and without dropping finished problems (layer_qps), FedLF's server
#      step at 11.2M parameters, a profile of FedLF's step and the FedLF-layout NF-ResNet-18's
#      throughput cell.
# Every step has its own time limit, so one that hangs costs only its share; results land in
# $RESULTS (default benchmarks/perf/results) as each step finishes. STEPS (default: all) names
# the steps to run, e.g. STEPS="layer_qps_cuda profile_fedlf_cuda"; with BUNDLE set, $RESULTS is
# packed into that tar file after every step (the device tool brings back at most 8 files).
#
#     RESULTS=$OUT bash benchmarks/perf/gpu_lease.sh
#
# Needs a python3 with torch (CUDA), lightning, timm, torchmetrics, cvxopt, mlxtend, pydantic,
# tenacity, jsonargparse, pytest, pytest-xdist; wheels missing there go in .whl/ and are installed
# into /tmp/site first. MLflow is not needed (the two CLI tests of test_threads are left out: the
# CLI opens an MLflow store).
set -u
RESULTS=${RESULTS:-benchmarks/perf/results}
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || { echo "wheel install failed"; exit 1; }
else
  export PYTHONPATH=$PWD
fi
STEPS=${STEPS:-all}
step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $RESULTS/NAME.log, say how it ended
  local name=$1 limit=$2; shift 2
  [[ "$STEPS" == all || " $STEPS " == *" $name "* ]] || return 0
  local started=$SECONDS
  echo "=== $name (limit ${limit}s)"
  timeout --kill-after=5 "$limit" "$@" > "$RESULTS/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - started)) s"
  tail -n 25 "$RESULTS/$name.log"
  if [[ -n "${BUNDLE:-}" ]]; then tar czf "$BUNDLE" -C "$RESULTS" .; fi
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$RESULTS/gpu.txt"
python3 -c "import torch, lightning, timm, cvxopt; print(torch.__version__, lightning.__version__, timm.__version__, torch.cuda.get_device_name(0))" \
  | tee -a "$RESULTS/gpu.txt"

step tests_cuda 130 python3 -m pytest -p no:cacheprovider -p no:randomly -q -n 8 --accelerator gpu \
  tests/fl_lightning/core/test_engines.py tests/fl_lightning/core/test_fused.py tests/fl_lightning/models/test_stacked.py tests/fl_lightning/core/test_resume.py tests/fl_lightning/core/test_threads.py \
  --deselect tests/fl_lightning/core/test_threads.py::test_the_cli_names_the_new_setting_when_given_the_old_flag \
  --deselect tests/fl_lightning/core/test_threads.py::test_a_cli_refusal_after_the_count_was_set_puts_the_process_count_back
step perf_cuda 190 python3 -m benchmarks.perf --device cuda --in-process --sections throughput \
  --max-timed-seconds 15 --out "$RESULTS/perf_cuda.json"
step aggregation_cuda 80 python3 -m benchmarks.perf.aggregation --device cuda --clients 100 \
  --sizes 0.8M nf_resnet18_fedlf nf_resnet18 --algorithms FedAvg FedFV FedMGDAPlus FedMDFG FedLF \
  --repeats 3 --out "$RESULTS/aggregation_cuda.json"
step paper_cells_cuda 70 python3 -m benchmarks.perf.paper_cells --device cuda --out "$RESULTS/paper_cells_cuda.json"
step engine_vs_reference_cuda 50 python3 -m benchmarks.perf.engine_vs_reference --device cuda --repeats 3 \
  --label h200-first --out "$RESULTS/engine_vs_reference_cuda.json"
step profile_cuda 30 python3 -m benchmarks.perf.profile_server --device cuda --out "$RESULTS/profile_cuda.txt"
step layer_qps_cuda 120 python3 -m benchmarks.perf.layer_qps --device cuda --repeats 3 --profile "$RESULTS/layer_qps_profile_cuda.txt" \
  --out "$RESULTS/layer_qps_cuda.json"
step fedlf_11m_cuda 90 python3 -m benchmarks.perf.aggregation --device cuda --clients 100 --sizes nf_resnet18 \
  --algorithms FedLF --repeats 1 --no-loops --out "$RESULTS/aggregation_fedlf_11m_cuda.json"
step profile_fedlf_cuda 60 python3 -m benchmarks.perf.profile_server --device cuda --algorithms FedLF \
  --size nf_resnet18_fedlf --out "$RESULTS/profile_fedlf_cuda.txt"
step perf_nf_resnet18_fedlf_cuda 75 python3 -m benchmarks.perf --device cuda --in-process --sections throughput \
  --models fl_nf_resnet18_fedlf --max-timed-seconds 15 --out "$RESULTS/perf_cuda_nf_resnet18_fedlf.json"
echo "=== done in $SECONDS s"
