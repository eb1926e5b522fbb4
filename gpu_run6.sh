#!/usr/bin/env bash
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
p=$(python3 -c 'import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],"lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$p:$LD_LIBRARY_PATH
mkdir -p $OUT/gpu $OUT/san
timeout 240 bash deploy/bundle/run_gpu_suite.sh .bundle $OUT/gpu . 2>&1 | grep -E "^PASS|^FAIL" 
timeout 60 python3 bench/kernels/moe_vs_grouped_mm.py --bin .bundle/bin/vamp_moe_bench --tokens 16,128,1024,2048,4096,8192 --out $OUT/moe.md > $OUT/moe.log 2>&1; echo "moe rc=$?"
timeout 60 python3 bench/kernels/attention_vs_sdpa.py .bundle/bin/vamp_attention_bench --out $OUT/attn.md > $OUT/attn.log 2>&1; echo "attn rc=$?"; grep "^| decode_b64\|^| prefill" $OUT/attn.md
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
export VAMP_TEST_DATA=$PWD/tests/data
for job in grouped_gemm:memcheck grouped_gemm:racecheck attention_bf16:memcheck attention_bf16:racecheck sampling:memcheck bf16:memcheck; do
  t=${job%%:*} tool=${job##*:}
  {
    timeout 40 $CS --tool $tool --error-exitcode 9 .bundle/bin/vamp_kernels_cuda_${t}_test --gtest_filter=-*Timing*:*Frequencies*:*LongContext* > $OUT/san/${t}_${tool}.log 2>&1
    echo "sanitizer $tool $t rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san/${t}_${tool}.log | tail -1)"
  }
done
